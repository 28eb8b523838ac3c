"""`shardrec predict` on a row with a value the model cannot read (a hex id of other letters, a
fraction in an integer column): one line naming the file, line, column and value, what the model
reads there and what to do. Before, `bad.csv:3: site_id: 'zzzzzzzz' (bad_hex)` and no more: not
why the row that preprocess would skip stops predict, nor what to change."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import assert_one_line_error, cli
from test_spec_flow import write_untrained_model

_SPEC = """[format]
kind = "csv"
header = true
[[columns]]
name = "click"
role = "label"
[[columns]]
name = "site_id"
role = "categorical"
kind = "hex"
hash_size = 100
[[columns]]
name = "n"
role = "dense"
type = "int"
"""


def test_a_value_the_model_cannot_read_says_what_it_reads_and_what_to_do(tmp_path: Path) -> None:
    log = tmp_path / "log.csv"
    log.write_text("click,site_id,n\n" + "".join(f"{i % 2},{i % 7:08x},{i}\n" for i in range(40)))
    (tmp_path / "s.toml").write_text(_SPEC)
    cli("preprocess", log, "--spec", tmp_path / "s.toml", "--out", tmp_path / "d")
    model = tmp_path / "m.safetensors"
    write_untrained_model(tmp_path / "d", model)
    fix = (
        r", as its training data was written; predict gives every row a probability and skips "
        r"none: correct the value or leave the row out\)$"
    )
    for row, field, value, reason, reads in (
        ("1,zzzzzzzz,3", "site_id", "zzzzzzzz", "bad_hex", "hex ids of 1 to 16 digits"),
        ("1,0000000a,1.5", "n", "1.5", "bad_integer", "whole numbers"),
    ):
        rows = tmp_path / "bad.csv"
        rows.write_text(f"click,site_id,n\n0,00000001,2\n{row}\n")
        assert_one_line_error(
            cli("predict", model, rows, "--out", tmp_path / "p.txt", ok=False),
            rf"^error: {re.escape(str(rows))}:3: {field}: '{re.escape(value)}' \({reason}\) "
            rf"\(the model reads {field} as {reads}{fix}",
        )
