"""A quoted field holding a line break is never trained on, wherever the text is cut: each of its
lines is a malformed row (bad_quote) whether the cut between two tasks (--chunk-mb), two pieces
of one task's text or two ranges of a gzip file falls inside it or not."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from helpers import cli, click_city_spec

from shardrec.tools.preprocess.tasks import task_run

ROWS, EVERY = 2000, 7  # every 7th row's city holds a line break: '1,"San<newline>0,Jose"'


def _log(path: Path) -> Path:
    # The field's second line, '0,Jose"', reads as a row of the spec's two columns by itself.
    rows = [
        '1,"San\n0,Jose"' if i % EVERY == 3 else f"{i % 2},c{i * 7919 % 10007}" for i in range(ROWS)
    ]
    text = "click,city\n" + "\n".join(rows) + "\n"
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text)
    return path


def _preprocess(tmp_path: Path, log: Path, *options: str) -> dict:
    spec = tmp_path / "s.toml"
    spec.write_text(click_city_spec())
    out = tmp_path / f"o{len(list(tmp_path.glob('o*')))}"
    return json.loads(
        cli("preprocess", log, "--spec", spec, "--out", out, "--json", *options).stdout
    )


BROKEN = sum(1 for i in range(ROWS) if i % EVERY == 3)


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("log.csv", ("--chunk-mb", "0.0005")),  # tasks cut every ~500 bytes
        ("log.csv.gz", ("--chunk-mb", "0.0002")),  # ranges cut as the text is decoded
        ("log.csv.gz", ("--chunk-mb", "0.0002", "--min-count", "1")),  # a planning pass cuts
    ],
)
def test_no_cut_reads_a_quoted_fields_later_line_as_a_row(
    tmp_path: Path, name: str, options: tuple[str, ...]
) -> None:
    """Before, a cut after a field's first line made its task read '0,Jose"' as a row (label 0,
    city 'Jose"'): the plain file at --chunk-mb 0.0005 kept 5 such rows (567 bad_quote, not 572), the gzip
    file 7."""
    res = _preprocess(tmp_path, _log(tmp_path / name), "--max-skipped-fraction", "0.5", *options)
    assert res["tasks_total"] > 10  # the text was cut many times
    assert res["rows_skipped"] == {"bad_quote": 2 * BROKEN}
    assert sum(res["rows_kept"].values()) == ROWS - BROKEN


def test_a_piece_cut_inside_a_quoted_field_reads_no_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One task reads its text in pieces (2 MiB at a time); before, a piece that began inside the
    field read '0,Jose"' as a row, here on pieces of 100 bytes (26 begin so)."""
    log = _log(tmp_path / "log.csv")
    whole = _preprocess(tmp_path, log, "--max-skipped-fraction", "0.5")
    monkeypatch.setattr(task_run, "PARSE_BYTES", 100)
    pieces = _preprocess(tmp_path, log, "--max-skipped-fraction", "0.5", "--workers", "1")
    assert pieces["tasks_total"] == 1
    assert pieces["rows_skipped"] == whole["rows_skipped"] == {"bad_quote": 2 * BROKEN}
    assert pieces["rows_kept"] == whole["rows_kept"]
