"""`spec infer` picks the delimiter that cuts the lines into the most fields, nearly the same number
each; a tie goes to the one that cuts more lines into exactly that number."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import cli

from shardrec.dataloader.spec.spec_file import load_spec


def test_a_semicolon_csv_of_decimal_commas_in_every_column_but_one_is_read_by_its_semicolons(
    tmp_path: Path,
) -> None:
    # Each row holds as many commas as semicolons ('1,15;3,21;1'); before, the comma won the tie
    # and the header became one column: "no column 'click' for the label (columns:
    # price;weight;click)".
    rng = np.random.default_rng(4)
    lines = ["price;weight;click"] + [
        f"{rng.integers(0, 9)},{rng.integers(10, 99)};{rng.integers(0, 9)},{rng.integers(10, 99)};"
        f"{rng.integers(0, 2)}"
        for _ in range(60)
    ]
    log, spec = tmp_path / "eu.csv", tmp_path / "eu.toml"
    log.write_text("\n".join(lines) + "\n")
    cli("spec", "infer", log, "--label", "click", "--out", spec)
    fmt = load_spec(spec).format
    assert (fmt.delimiter, fmt.decimal, fmt.header) == (";", ",", True)
    cli("preprocess", log, "--spec", spec, "--out", tmp_path / "d")
    (first,) = json.loads(cli("data", "head", tmp_path / "d", "--rows", "1", "--json").stdout)
    price, weight, click = lines[1].replace(",", ".").split(";")
    assert first["price"] == pytest.approx(np.log1p(float(price)), rel=1e-6)
    assert first["weight"] == pytest.approx(np.log1p(float(weight)), rel=1e-6)
    assert first["label"] == int(click)


def test_commas_in_a_semicolon_csvs_text_make_no_list(tmp_path: Path) -> None:
    # A MovieLens join written by a spreadsheet of decimal commas: before, the titles' commas
    # made a list ('title', separator ',', max_length 2: "Movie 7" and " The (1995)" two ids),
    # where the README says a comma cuts lists in a TSV only.
    rows = [
        f"{i % 50};{'4,5' if i % 3 else '2,0'};Movie {i % 40}, The ({1950 + i % 40});"
        f"{'Comedy|Drama' if i % 2 else 'Drama'}"
        for i in range(200)
    ]
    log, spec = tmp_path / "ml.csv", tmp_path / "ml.toml"
    log.write_text("userId;rating;title;genres\n" + "\n".join(rows) + "\n")
    cli("spec", "infer", log, "--label", "rating>=4", "--out", spec)
    columns = {c.name: c for c in load_spec(spec).columns}
    assert (columns["title"].role, columns["title"].kind) == ("categorical", "string")
    assert (columns["genres"].role, columns["genres"].separator) == ("list", "|")
    cli("preprocess", log, "--spec", spec, "--out", tmp_path / "d")
    (first,) = json.loads(cli("data", "head", tmp_path / "d", "--rows", "1", "--json").stdout)
    assert isinstance(first["title"], int) and len(first["genres"]) == 1
