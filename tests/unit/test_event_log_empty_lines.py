"""`shardrec predict` on a CSV/TSV event log writes one probability a row; an empty line among the
rows is no row (pyarrow's reader skips it), so the probabilities pasted beside the file's lines
were a line off after it, without a word. It is refused naming its line, as a click log's rows
refuse it; blank lines that end the file are no rows and stay accepted."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from helpers import EVENT_SPEC

from shardrec.tools.preprocess.events.log_text import empty_line_among_rows, row_line
from shardrec.tools.synth.yambda import write_yambda_like

FEATURES = ["uid", "hist_item", "hist_artist", "hist_ts", "hist_action", "cand_item", "cand_artist"]
"""The features a model of EVENT_SPEC reads (its file's header says them)."""


def _scored(path: Path, spec: Path, known: int) -> int:
    """The rows predict scores of the log at `path` (event_row_batches: the CLI prints its
    refusal as `error: ...`)."""
    from shardrec.dataloader.spec.event_spec_file import load_event_spec
    from shardrec.tools.preprocess.events.raw_events import event_row_batches

    header = {
        "transform": {"events_spec": load_event_spec(spec).to_dict()},
        "tables": [],
        "feature_names": FEATURES,
    }
    maps = (np.zeros(known, np.int64), np.zeros(known, np.int64))
    return event_row_batches(header, maps, path)[0]


def test_an_empty_line_among_a_logs_rows_is_refused_naming_it(tmp_path: Path) -> None:
    # Before: 2,862 probabilities for the 2,863 lines after the header; the one written beside
    # line 102 was line 103's.
    from shardrec.tools.preprocess.events.event_columns import EventLogError

    write_yambda_like(tmp_path, 400, seed=1)
    log = pq.read_table(tmp_path / "events.parquet")
    log = log.set_column(4, "event_type", log["event_type"].cast(pa.string()))
    spec = tmp_path / "spec.toml"
    spec.write_text('[format]\nkind = "csv"\n' + EVENT_SPEC)
    path = tmp_path / "events.csv"
    pcsv.write_csv(log, path)
    known = int(log["item_id"].to_numpy().max()) + 1
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines) + "\n\r\n  \n")  # blank lines that end it: no rows
    assert _scored(path, spec, known) == len(lines) - 1
    path.write_text("\n".join([*lines[:101], "", *lines[101:]]) + "\n")
    with pytest.raises(EventLogError) as refused:
        _scored(path, spec, known)
    assert str(refused.value) == (
        f"{path}:102: an empty line among the rows, which is no row: predict writes one "
        "probability a row, which pasted beside the file's lines would be a line off from there "
        "on; remove the empty lines first"
    )


def test_an_empty_line_before_a_logs_header_is_named_as_such(tmp_path: Path) -> None:
    # Before: "line 1: an empty line among the rows", of a line above the header.
    from shardrec.tools.preprocess.events.event_columns import EventLogError

    write_yambda_like(tmp_path, 50, seed=1)
    log = pq.read_table(tmp_path / "events.parquet")
    log = log.set_column(4, "event_type", log["event_type"].cast(pa.string()))
    spec = tmp_path / "spec.toml"
    spec.write_text('[format]\nkind = "csv"\n' + EVENT_SPEC)
    path = tmp_path / "events.csv"
    pcsv.write_csv(log, path)
    path.write_text("\r\n\n" + path.read_text())
    with pytest.raises(EventLogError) as refused:
        _scored(path, spec, int(log["item_id"].to_numpy().max()) + 1)
    assert str(refused.value) == (
        f"{path}:1: an empty line before the header (line 3): a log's first line is its header, "
        "which names its columns; remove the empty lines above it"
    )


def test_the_first_empty_line_a_row_follows_is_found_across_chunks(tmp_path: Path) -> None:
    rng = random.Random(0)
    path = tmp_path / "log.csv"
    for _ in range(200):
        lines = [rng.choice(["a,b", "", "\r", " ", "\t", ","]) for _ in range(rng.randrange(1, 12))]
        data = "\n".join(lines) + rng.choice(["", "\n"])
        path.write_bytes(data.encode())
        rows = [i for i, line in enumerate(lines) if line.strip(" \t\r")]
        empty = [i for i, line in enumerate(lines) if not line.strip("\r")]
        first = next((i + 1 for i in empty if rows and rows[-1] > i), None)
        for chunk in (1, 2, 5, 64):
            assert empty_line_among_rows(path, ",", chunk) == first, (data, chunk)
        held = [i for i, line in enumerate(lines) if line.strip("\r")]  # pyarrow's rows
        for row, line in enumerate(held[1:]):
            assert row_line(path, row, chunk=3) == line + 1, (data, row)
