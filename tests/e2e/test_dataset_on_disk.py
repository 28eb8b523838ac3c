"""The README's "The dataset on disk": its polars and pyarrow.dataset block, run exactly as
written (taken from the README) on a preprocessed dataset in `data/`, with the packages
installed; and what it prints agrees with the dataset's own parts."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import numpy as np
from helpers import cli

from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.format.part_file import open_split

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_block() -> str:
    section = README.read_text().split("### The dataset on disk", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readmes_polars_and_pyarrow_block_reads_the_parts_as_written(tmp_path: Path):
    cli("synth", tmp_path / "raw", "--rows", "3000", "--seed", "2", "--max-vocab", "300")
    cli("preprocess", tmp_path / "raw", "--out", tmp_path / "data", "--chunk-mb", "0.2")
    manifest = Manifest.load(tmp_path / "data")
    assert len(manifest.splits["train"].parts) > 1  # the glob and the dataset span parts
    printed = io.StringIO()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with contextlib.redirect_stdout(printed):
            exec(_readme_block(), {})
    finally:
        os.chdir(cwd)
    lines = printed.getvalue().splitlines()
    parts = open_split(tmp_path / "data", "train", manifest)
    labels = np.concatenate([p.labels for p in parts])
    c1 = np.concatenate([p.sparse["C1"] for p in parts])
    # polars: the first rows' label and C1, then per label the rows and distinct C1 ids
    head = "\n".join(lines)
    for r in range(3):
        assert re.search(rf"│ {labels[r]}\s+┆ {c1[r]}\s+│", head), head
    for label in (0, 1):
        rows, distinct = int((labels == label).sum()), len(np.unique(c1[labels == label]))
        assert re.search(rf"│ {label}\s+┆ {rows}\s+┆ {distinct}\s+│", head), head
    # pyarrow.dataset: the split's rows, the dense block's type, the positive rows
    assert f"{manifest.splits['train'].rows} fixed_size_list<item: float not null>[13]" in lines
    assert lines[-1] == str(int(labels.sum()))
