"""A preprocessing run refused where no --max-skipped-fraction would let it finish (no row kept,
README, Failures and trust: Bad input) leaves nothing behind: the command its refusal advises
(other options, a corrected spec) starts afresh in the same --out.

Before, the refused run left OUT/.work (and its parts), and the advised rerun was refused in turn:
"error: out: holds a run with different schema; remove the directory or choose another --out"."""

from __future__ import annotations

import gzip
from pathlib import Path

from helpers import assert_one_line_error, cli


def _csv(tmp_path: Path) -> Path:
    cli("synth", tmp_path / "raw", "--csv", "--rows", "300")
    return tmp_path / "raw" / "train.csv"


def test_the_rerun_a_refusal_advises_is_taken_in_the_same_out(tmp_path: Path) -> None:
    log, out = _csv(tmp_path), tmp_path / "out"
    refused = cli("preprocess", log, "--out", out, "--max-ids", "100", ok=False)
    assert_one_line_error(
        refused,
        r"^error: .*: no rows kept, .*\(commas in the row: a CSV file\? preprocess it with --csv\)",
    )
    assert not out.exists()
    cli("preprocess", log, "--out", out, "--max-ids", "100", "--csv")
    assert (out / "manifest.json").is_file()


def test_a_folder_that_was_there_keeps_only_what_it_held(tmp_path: Path) -> None:
    log, out = _csv(tmp_path), tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    cli("preprocess", log, "--out", out, "--max-ids", "100", "--workers", "2", ok=False)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_a_day_of_blank_lines_alone_is_refused_as_an_empty_one_is(tmp_path: Path) -> None:
    """Blank lines that end a file are no rows (text.lines): a training day of nothing else, plain
    or .gz, was taken as a day of no rows without a word, where a 0-byte day is refused."""
    cli("synth", tmp_path / "raw", "--rows", "2000", "--days", "3")
    days, out = tmp_path / "raw", tmp_path / "out"
    (days / "day_1").write_text("\n\n\n")
    refused = cli("preprocess", days, "--out", out, ok=False)
    assert_one_line_error(
        refused, r"^error: .*day_1: only blank lines, no rows: take it out of the inputs$"
    )
    assert not out.exists()
    (days / "day_1").unlink()
    (days / "day_1.gz").write_bytes(gzip.compress(b"\n\r\n\n"))
    refused = cli("preprocess", days, "--out", out, ok=False)
    assert_one_line_error(
        refused, r"^error: .*day_1.gz: no data lines, no rows: take it out of the inputs$"
    )
    assert not out.exists()
