"""The README's "Feature spec reference" against what preprocessing does with each key."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from helpers import cli

from shardrec.dataloader.format.manifest import Manifest

README = Path(__file__).resolve().parents[2] / "README.md"


def _format_row(key: str) -> str:
    """The README's row of a `[format]` key."""
    return re.search(rf"^\| `{key}` \|.*$", README.read_text(), re.M).group(0)


def test_a_parquet_spec_reads_the_files_its_files_pattern_names(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    log = pa.table({"click": [0, 1] * 20, "site": [f"s{i % 7}" for i in range(40)]})
    for name in ("part-0.parquet", "part-1.parquet", "old-0.parquet"):
        pq.write_table(log, logs / name)
    spec = tmp_path / "pq.toml"
    spec.write_text(
        '[format]\nkind = "parquet"\nfiles = "part-*.parquet"\n\n'
        '[[columns]]\nname = "click"\nrole = "label"\n\n'
        '[[columns]]\nname = "site"\nrole = "categorical"\nhash_size = 16\n'
    )
    cli("preprocess", logs, "--spec", spec, "--out", tmp_path / "data")
    inputs = Manifest.load(tmp_path / "data").options["inputs"]
    assert [i["name"] for i in inputs] == ["part-0.parquet", "part-1.parquet"]
    # Before, the README said that no other key of [format] applies to Parquet files.
    assert "only `files` applies" in _format_row("kind")
    assert "`*.parquet` for parquet" in _format_row("files")
