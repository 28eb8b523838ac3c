"""`shardrec predict` on raw rows reads blank lines that end the file as preprocess does: no rows.
Before, 'error: rows.csv:4: row: (empty line) (empty_row)', exit 1, and nothing scored."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import assert_one_line_error, cli, click_city_spec
from test_spec_flow import write_untrained_model


def test_blank_lines_that_end_the_rows_are_no_rows(tmp_path: Path) -> None:
    log = tmp_path / "log.csv"
    log.write_text("click,city\n" + "".join(f"{i % 2},c{i % 5}\n" for i in range(40)))
    (tmp_path / "s.toml").write_text(click_city_spec(hash_size=10))
    cli("preprocess", log, "--spec", tmp_path / "s.toml", "--out", tmp_path / "d")
    model = tmp_path / "m.safetensors"
    write_untrained_model(tmp_path / "d", model)
    rows = "click,city\n1,c1\n0,c2\n"
    (tmp_path / "rows.csv").write_text(rows)
    cli("predict", model, tmp_path / "rows.csv", "--out", tmp_path / "want.txt")
    # Lines of spaces and tabs (not the delimiter, as pandas reads them) are blank lines too.
    # Before: 'error: spaces.csv:4: row: 1 fields, the spec needs at least 2 of 2
    # (too_few_fields)', where a last one without its newline was dropped.
    endings = (("one", "\n"), ("crlf", "\r\n\n\r"), ("spaces", " \t\n\r \n  "), ("last", "  "))
    for name, ending in endings:
        (tmp_path / f"{name}.csv").write_text(rows + ending, newline="")
        for flags in ((), ("--no-label",)):
            out = tmp_path / f"{name}{len(flags)}.txt"
            cli("predict", model, tmp_path / f"{name}.csv", "--out", out, *flags)
            assert out.read_bytes() == (tmp_path / "want.txt").read_bytes()
    # One with rows after it is a malformed row, as preprocess reads it.
    (tmp_path / "middle.csv").write_text("click,city\n1,c1\n\n0,c2\n")
    assert_one_line_error(
        cli("predict", model, tmp_path / "middle.csv", "--out", tmp_path / "x.txt", ok=False),
        rf"^error: {re.escape(str(tmp_path / 'middle.csv'))}:3: row: \(empty line\) \(empty_row\)$",
    )
