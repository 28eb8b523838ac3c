"""Text whose lines end in a carriage return alone (classic Mac OS, some old exports) is refused
in one line before anything is read: a reader of newlines sees one line, one malformed row."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import assert_one_line_error, cli, click_city_spec


def _refusal(path: Path) -> str:
    return (
        "^error: "
        + re.escape(
            f"{path}: its lines end in a carriage return ('\\r') alone, not a newline, so the file "
            f"reads as one line; convert them first (tr '\\r' '\\n' < {path} > "
            f"{path.stem}-lf{path.suffix})"
        )
        + "$"
    )


def test_lines_ended_by_a_carriage_return_alone_are_refused_in_one_line(tmp_path: Path) -> None:
    """Before, the header's file said "the header has no column 'city' that s.toml names; did you
    mean city1?", the headerless one "1 lines are malformed (too_many_fields 1)", and infer "1
    line(s): too few to infer a spec from"."""
    rows = "".join(f"{i % 2},c{i}\r" for i in range(20))
    for header in ("true", "false"):
        log, spec = tmp_path / f"log-{header}.csv", tmp_path / f"s-{header}.toml"
        log.write_bytes((("click,city\r" if header == "true" else "") + rows).encode())
        spec.write_text(click_city_spec(header == "true", hash_size=100))
        refused = cli("preprocess", log, "--spec", spec, "--out", tmp_path / header, ok=False)
        assert_one_line_error(refused, _refusal(log))
    log = tmp_path / "log-true.csv"
    assert_one_line_error(cli("spec", "infer", log, "--label", "click", ok=False), _refusal(log))
    day = tmp_path / "day_0"
    day.write_bytes(b"1\t5\t0a0a0a0a\r0\t3\t0b0b0b0b\r")
    refused = cli("preprocess", day, "--num-dense", "1", "--num-sparse", "1",
                  "--out", tmp_path / "criteo", ok=False)  # fmt: skip
    assert_one_line_error(refused, _refusal(day))
