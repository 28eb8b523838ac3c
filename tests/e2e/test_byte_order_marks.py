"""A UTF-8 byte-order mark (what some spreadsheets write first) is read past in a header; before a
first line that is a row, it is refused in one line that says how to remove it: read, it would be
part of that row's first value."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from helpers import assert_one_line_error, cli

BOM = b"\xef\xbb\xbf"
SPEC = """[format]
kind = "csv"
header = {header}

[[columns]]
name = "city"
role = "categorical"
kind = "string"
hash_size = 100

[[columns]]
name = "click"
role = "label"
"""
ROWS = b"".join(b"red,1\nblue,0\n" for _ in range(50))


def _spec(tmp_path: Path, header: bool) -> Path:
    spec = tmp_path / f"s-{header}.toml"
    spec.write_text(SPEC.format(header=str(header).lower()))
    return spec


def test_a_mark_before_a_first_row_is_refused_in_one_line(tmp_path: Path) -> None:
    """Before, the first row's city read as '\\ufeffred' and took another id than every other
    'red' (22, not 66), with nothing said; a mark before a label made that row bad_label."""
    spec = _spec(tmp_path, header=False)
    log, packed = tmp_path / "log.csv", tmp_path / "log.csv.gz"
    log.write_bytes(BOM + ROWS)
    packed.write_bytes(gzip.compress(BOM + ROWS, mtime=0))
    sed = r"sed '1s/^\xEF\xBB\xBF//'"
    for path, command in (
        (log, f"{sed} {log} > log-nobom.csv"),
        (packed, f"zcat {packed} | {sed} | gzip > log-nobom.csv.gz"),
    ):
        said = (
            f"{path}: starts with a UTF-8 byte-order mark, and its first line is a row (no "
            f"header): the mark would be read into that row's first field; remove it first "
            f"({command})"
        )
        refused = cli("preprocess", path, "--spec", spec, "--out", tmp_path / "o", ok=False)
        assert_one_line_error(refused, "^error: " + re.escape(said) + "$")
    assert not (tmp_path / "o").exists()


def test_a_mark_before_a_header_is_read_past(tmp_path: Path) -> None:
    log, out = tmp_path / "log.csv", tmp_path / "o"
    log.write_bytes(BOM + b"city,click\n" + ROWS)
    cli("preprocess", log, "--spec", _spec(tmp_path, header=True), "--out", out)
    rows = json.loads(cli("data", "head", out, "--json").stdout)
    assert [r["city"] for r in rows[:3:2]] == [rows[0]["city"]] * 2 and rows[0]["label"] == 1


def test_spec_infer_refuses_a_mark_before_a_first_row_as_preprocess_does(tmp_path: Path) -> None:
    """Before, `spec infer` read past the mark and wrote a spec (header = false) that preprocess
    then refused for the file it came from; with a header both read past it."""
    log, spec = tmp_path / "log.csv", tmp_path / "s.toml"
    log.write_bytes(BOM + ROWS)
    said = "^error: " + re.escape(f"{log}: starts with a UTF-8 byte-order mark, and its first line")
    refused = cli("spec", "infer", log, "--label", "1", "--out", spec, ok=False)
    line = assert_one_line_error(refused, said)
    preprocess = cli("preprocess", log, "--spec", _spec(tmp_path, False), "--out", tmp_path / "o",
                     ok=False)  # fmt: skip
    assert assert_one_line_error(preprocess, said) == line and not spec.exists()
    log.write_bytes(BOM + b"city,click\n" + ROWS)
    cli("spec", "infer", log, "--label", "click", "--out", spec)
    cli("preprocess", log, "--spec", spec, "--out", tmp_path / "o")
    assert json.loads(cli("data", "head", tmp_path / "o", "--json").stdout)[0]["label"] == 1
