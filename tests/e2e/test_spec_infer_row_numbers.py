"""A column that counts the rows (the unnamed index pandas' to_csv writes first) is proposed as
ignored, with why: as a dense feature, the model would learn from a row's place in the file."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import cli

from shardrec.dataloader.spec.spec_file import load_spec


def test_a_pandas_index_column_is_proposed_ignored_with_its_note(tmp_path: Path) -> None:
    """Before, the column (header name "") was proposed as `role = "dense"`, type int, log1p,
    and its note ("integers, min 0") was lost with its renamed name, c_0."""
    log, spec = tmp_path / "pandas.csv", tmp_path / "s.toml"
    rows = "".join(f"{i},{i % 3 == 0},c{i % 7},{i % 11}\n" for i in range(300))
    log.write_text(",click,city,count\n" + rows)
    cli("spec", "infer", log, "--label", "click", "--out", spec)
    text = spec.read_text()
    note = "# the row's number (0, 1, 2, ...; a pandas index?), not a feature\n"
    assert note + '[[columns]]\nname = "c_0"\nrole = "ignore"\nposition = 0\n' in text
    assert [c.name for c in load_spec(spec).columns] == ["c_0", "click", "city", "count"]
    assert load_spec(spec).columns[3].role == "dense"  # a count that repeats stays a feature
    res = json.loads(
        cli("preprocess", log, "--spec", spec, "--out", tmp_path / "o", "--json").stdout
    )
    assert sum(res["rows_kept"].values()) == 300 and res["rows_skipped"] == {}


def test_a_float_column_that_differs_in_every_row_is_a_dense_feature(tmp_path: Path) -> None:
    """A price of 15 decimals was proposed as `role = "ignore"`, "a different value in every row:
    a row id, not a feature": the model lost it without a word. A long integer that differs in
    every row is still a row id."""
    log, spec = tmp_path / "prices.csv", tmp_path / "s.toml"
    rng = __import__("random").Random(3)
    rows = "".join(
        f"{i % 2},{rng.uniform(1, 90):.15f},{10**11 + 7 * i},c{i % 5}\n" for i in range(300)
    )
    log.write_text("click,price,order_no,city\n" + rows)
    cli("spec", "infer", log, "--label", "click", "--out", spec)
    roles = {c.name: (c.role, getattr(c, "type", None)) for c in load_spec(spec).columns}
    assert roles["price"] == ("dense", "float")
    assert roles["order_no"][0] == "ignore"
