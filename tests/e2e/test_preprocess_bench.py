"""`shardrec bench preprocess` runs end to end on a tiny file and reports its ratios (no timing asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardrec.tools.cli.app import app


@pytest.mark.slow
def test_bench_preprocess_reports_ratios(tmp_path: Path):
    result = CliRunner().invoke(app, ["bench", "preprocess", "--size-gb", "0.003", "--work-dir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)  # progress notes go to stderr
    assert report["file_mb"] > 2 and report["workers"] == 1
    for key in ("end_to_end_mb_s_per_worker", "pandas_mb_s", "parse_only_mb_s", "peak_rss_mb"):
        assert report[key] > 0, key
    # On a file this small process start-up dominates, so a ratio can round to 0.
    for key in ("ratio_end_to_end_vs_pandas", "ratio_end_to_end_vs_pandas_cpu", "ratio_parse_vs_pandas_cpu"):
        assert report[key] >= 0, key
    assert (tmp_path / "bench.tsv").is_file() and not (tmp_path / "out").exists()
    # The baseline says what it was: pandas' C engine, and the dtype it gave the hex columns.
    assert report["pandas"]["engine"] == "c" and report["pandas"]["version"]
    assert report["pandas"]["dtypes"]["hex_columns"] in ("str", "object", "string")
    assert set(report["goals"]) == {"end_to_end_3x_pandas_per_core", "end_to_end_100_mb_s_per_core", "peak_rss_under_2_gb"}
    assert all(isinstance(v, bool) for v in report["goals"].values())
