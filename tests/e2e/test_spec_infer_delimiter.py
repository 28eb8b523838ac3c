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
