"""A compressed event log (.gz, .bz2, .lz4, .zst: read as it decompresses) makes the dataset its
plain text makes: blank lines that end it are no rows, and one between rows is refused naming its
line. Before, blank lines that ended a compressed log were refused as a row of one field, though
the plain file was accepted: 'events.csv.gz:2864: expected 7 fields, got 1 (...)'."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from helpers import EVENT_SPEC, assert_one_line_error, cli

from shardrec.tools.preprocess.events.log_text import BeforeBlankLines
from shardrec.tools.preprocess.text.lines import blank_bytes, blank_tail
from shardrec.tools.synth.yambda import write_yambda_like, yambda_like


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    raw = tmp_path_factory.mktemp("raw")
    write_yambda_like(raw, 3_000, seed=1)
    table = pq.read_table(raw / "events.parquet")
    pcsv.write_csv(
        table.set_column(4, "event_type", table["event_type"].cast(pa.string())), raw / "events.csv"
    )
    pq.write_table(
        pa.table(yambda_like(3_000, seed=1)["artist"]), raw / "artist_item_mapping.parquet"
    )
    (raw / "spec.toml").write_text('[format]\nkind = "csv"\n' + EVENT_SPEC)
    cli("preprocess", raw / "events.csv", "--events", raw / "spec.toml", "--out", raw / "plain")
    return raw


def _compressed(path: Path, text: bytes) -> Path:
    codec = {".gz": "gzip", ".bz2": "bz2", ".lz4": "lz4", ".zst": "zstd"}[path.suffix]
    with pa.output_stream(str(path), compression=codec) as out:
        out.write(text)
    return path


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_blank_lines_that_end_a_compressed_log_are_no_rows(tmp_path, raw, suffix):
    text = (raw / "events.csv").read_bytes() + b"  \n\t\n\r\n"
    path = _compressed(raw / f"ends{suffix}", text)
    out = tmp_path / "out"
    cli("preprocess", path, "--events", raw / "spec.toml", "--out", out)
    part = "events/part-00000.arrow"
    assert (out / part).read_bytes() == (raw / "plain" / part).read_bytes()


def test_a_blank_line_between_rows_of_a_compressed_log_is_refused_naming_it(tmp_path, raw):
    lines = (raw / "events.csv").read_bytes().split(b"\n")
    path = _compressed(raw / "mid.gz", b"\n".join([*lines[:40], b" ", *lines[40:]]) + b" \n")
    assert_one_line_error(
        cli("preprocess", path, "--events", raw / "spec.toml", "--out", tmp_path / "o", ok=False),
        rf"^error: {re.escape(str(path))}:41: expected 7 fields, got 1 ",
    )


class _Pieces:
    """A stream that gives `data` in reads of at most `size` bytes, as a decompressor may."""

    def __init__(self, data: bytes, size: int) -> None:
        self.data, self.size, self.at = data, size, 0

    def read(self, n: int) -> bytes:
        piece = self.data[self.at : self.at + min(n, self.size)]
        self.at += len(piece)
        return piece


def test_the_text_read_in_pieces_is_the_text_less_its_blank_last_lines() -> None:
    # The pieces cut lines (blank or not) anywhere: what is held back must be what follows the
    # last line that is not blank, however the lines fall across them.
    rng = random.Random(0)
    blank = blank_bytes(",")
    for _ in range(300):
        data = bytes(rng.choice(b"a, \t\r\n\n") for _ in range(rng.randrange(0, 40)))
        end = blank_tail(data, 0, len(data), blank)
        for size in (1, 2, 3, 7, 64):
            stream = BeforeBlankLines(_Pieces(data, size), blank, block=size)
            assert stream.read() == data[:end], (data, size)
