"""`shardrec bench scale` at the smallest fraction (192 rows), on 1 worker and 1 rank, training included:
every stage reports figures that are the arithmetic of what it measured, the rows add up and the
projection is the arithmetic it prints. The arithmetic itself on known figures (several ranks, the
projection) is tests/unit/test_bench_scale_arithmetic.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardrec.tools.bench.scale.scale_bench import DAYS, feature_counts
from shardrec.tools.bench.scale.scale_report import DISK_GB_PER_S, PROJECTED_CORES
from shardrec.tools.bench.scale.scale_stream import STREAM_ROUNDS

FRACTION = 1e-9  # below 192 / 4.37 B: the command's floor of 8 rows per day


def _scale(tmp_path: Path, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "shardrec.tools.cli", "bench", "scale", "--fraction", str(FRACTION), "--batch", "32",
           "--workers", "1", "--work-dir", str(tmp_path / "w"), "--json", *extra]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def _check_rates(s: dict, nbytes: int, rows: int, wall_s: float, cpu_s: float) -> None:
    assert s["mb_per_s_wall"] == pytest.approx(nbytes / 1e6 / wall_s) and s[
        "rows_per_s_wall"
    ] == pytest.approx(rows / wall_s)
    assert s["mb_per_cpu_s"] == pytest.approx(nbytes / 1e6 / cpu_s) and s[
        "rows_per_cpu_s"
    ] == pytest.approx(rows / cpu_s)


def _check_common(out: dict, tmp_path: Path, ranks: int) -> None:
    st, synth = out["stages"], out["stages"]["synth"]
    assert out["rows"] == DAYS * 8 and out["workers"] == 1
    assert len(list((tmp_path / "w" / "raw").glob("day_*.gz"))) == DAYS
    assert synth["rows"] == out["rows"] and synth["text_bytes"] > synth["gzip_bytes"] > 0
    _check_rates(synth, synth["text_bytes"], synth["rows"], synth["wall_s"], synth["cpu_s"])
    for name in ("preprocess_hash", "preprocess_vocab"):
        s = st[name]
        assert (
            s["lines"] == out["rows"] and sum(s["rows_kept"].values()) == out["rows"]
        )  # synth rows are well formed
        assert s["parts"] >= DAYS and s["output_bytes"] > 0
        assert s["files"] == s["parts"] + 1 and s["files_goal_met"]  # one file per part
        assert (
            s["wall_s"] > 0 and s["cpu_s"] > 0 and 0 < s["peak_pss_mb"] <= s["peak_rss_mb"] + 1
        ), name
        _check_rates(s, synth["text_bytes"], s["lines"], s["wall_s"], s["cpu_s"])
    stream, hashed = st["stream"], st["preprocess_hash"]
    assert (
        stream["ranks"] == ranks
        and len(stream["per_rank"]) == ranks
        and stream["global_batch"] == 32
    )
    assert stream["rows"] == hashed["rows_kept"]["train"] // 32 * 32 > 0
    assert stream["rows"] == sum(r["rows"] for r in stream["per_rank"])
    assert stream["rows_per_s"] == pytest.approx(stream["rows"] / stream["loop_s"])
    assert stream["mb_per_cpu_s"] == pytest.approx(hashed["output_bytes"] / 1e6 / stream["cpu_s"])
    # The ratio through the rounds harness, after the first pass: 192 rows read in milliseconds,
    # too small to give a figure (the figures themselves: test_bench_scale_arithmetic.py).
    vs = stream["ratio_vs_one_part"]
    assert vs["rounds"] == STREAM_ROUNDS and "under 0.2 s" in vs["too_small"]
    assert stream["vs_one_part"] is None and stream["one_part"]["rows"] == stream["rows"]
    manifest = json.loads((tmp_path / "w" / "hash" / "manifest.json").read_text())
    assert [f["cardinality"] for f in manifest["sparse_features"]] == feature_counts(FRACTION)
    p = out["projection"]
    for name in ("preprocess_hash", "preprocess_vocab"):
        s, q = st[name], p[name]
        cpu_s = synth["text_bytes"] / FRACTION / 1e6 / s["mb_per_cpu_s"] / PROJECTED_CORES
        disk_s = (synth["gzip_bytes"] + s["output_bytes"]) / FRACTION / 1e9 / DISK_GB_PER_S
        assert (
            q["minutes"] == pytest.approx(max(cpu_s, disk_s) / 60)
            and f"= {cpu_s:,.0f} s" in q["arithmetic"]
        )


def test_scale_reports_each_stage_trains_resumes_and_projects_1tb(tmp_path: Path):
    # One run of every stage (the suite's budget): the stream and the training on 1 rank; the
    # combination of several ranks' figures is checked on known figures in the unit test.
    out = _scale(tmp_path, "--ranks", "1", "--steps", "2")
    _check_common(out, tmp_path, ranks=1)
    assert out["stages"]["train"]["summary"]["steps"] == 2
    assert out["stages"]["train_resume"]["summary"] == {
        **out["stages"]["train_resume"]["summary"],
        "steps": 4,
        "resumed_from_step": 2,
    }
