"""A NaN or an infinity in a Parquet float column is a malformed row, as `nan` or `inf` in a text
field is: never a dense input of 0 or infinity, never a label from a threshold it cannot meet; a
float with a fraction in a `type = "int"` column is one too, as `1.5` in a text field is; a
decimal column is refused in one line that says what to write instead."""

from __future__ import annotations

import decimal
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from helpers import assert_one_line_error, cli, cli_process

from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.format.part_file import open_split

SPEC = """[format]
kind = "parquet"

[[columns]]
name = "rating"
role = "label"
threshold = 4.0

[[columns]]
name = "price"
role = "dense"
type = "float"

[[columns]]
name = "site"
role = "categorical"
hash_size = 100
"""


def test_nan_and_infinite_parquet_numbers_are_malformed_rows(tmp_path: Path):
    rows = 200
    price = [float(i) for i in range(rows)]
    price[1], price[2], price[4] = float("nan"), float("inf"), float("-inf")
    rating = [float(i % 5 + 1) for i in range(rows)]
    rating[6], rating[7] = float("nan"), float("inf")
    pq.write_table(
        pa.table({"rating": rating, "price": price, "site": [f"s{i % 7}" for i in range(rows)]}),
        tmp_path / "log.parquet",
    )
    (tmp_path / "s.toml").write_text(SPEC)
    res = json.loads(cli("preprocess", tmp_path / "log.parquet", "--spec", tmp_path / "s.toml",
                         "--out", tmp_path / "o", "--max-skipped-fraction", "0.05",
                         "--json").stdout)  # fmt: skip
    assert res["rows_skipped"] == {"bad_float": 3, "bad_label": 2}
    where = tmp_path / "log.parquet"
    assert res["first_errors"] == [
        f"{where}: row 2: price: nan (bad_float)",
        f"{where}: row 3: price: inf (bad_float)",
        f"{where}: row 5: price: -inf (bad_float)",
        f"{where}: row 7: rating: nan (bad_label)",
        f"{where}: row 8: rating: inf (bad_label)",
    ]
    manifest = Manifest.load(tmp_path / "o")
    dense = np.concatenate(
        [p.dense for split in manifest.splits for p in open_split(tmp_path / "o", split, manifest)]
    )
    assert len(dense) == rows - 5 and np.isfinite(dense).all()


def test_a_fraction_in_an_int_dense_column_is_a_malformed_row(tmp_path: Path):
    rows = 200
    price = [float(i) for i in range(rows)]
    price[1], price[3] = 1.5, 1e19  # kept, as 1.5 and 1e19, where text's `1.5` is malformed
    pq.write_table(
        pa.table({"rating": [i % 5 + 1 for i in range(rows)], "price": price,
                  "site": [f"s{i % 7}" for i in range(rows)]}),
        tmp_path / "log.parquet",
    )  # fmt: skip
    (tmp_path / "s.toml").write_text(SPEC.replace('type = "float"', 'type = "int"'))
    res = json.loads(cli("preprocess", tmp_path / "log.parquet", "--spec", tmp_path / "s.toml",
                         "--out", tmp_path / "o", "--max-skipped-fraction", "0.05",
                         "--json").stdout)  # fmt: skip
    where = tmp_path / "log.parquet"
    assert res["rows_skipped"] == {"bad_integer": 2}
    assert res["first_errors"] == [
        f"{where}: row 2: price: 1.5 (bad_integer)",
        f"{where}: row 4: price: 1e+19 (bad_integer)",
    ]


def test_a_decimal_column_read_as_dense_is_refused_saying_what_to_write(tmp_path: Path):
    """Before: "... makes it a dense, which needs a number", which a decimal is."""
    price = pa.array([decimal.Decimal("1.50"), decimal.Decimal("2.25")], pa.decimal128(5, 2))
    table = pa.table({"rating": [1.0, 5.0], "price": price, "site": ["a", "b"]})
    pq.write_table(table, tmp_path / "log.parquet")
    (tmp_path / "s.toml").write_text(SPEC)
    refused = cli("preprocess", tmp_path / "log.parquet", "--spec", tmp_path / "s.toml",
                  "--out", tmp_path / "o", ok=False)  # fmt: skip
    said = (
        f"{tmp_path / 'log.parquet'}: column 'price' is decimal128(5, 2) in the Parquet file; "
        f"{tmp_path / 's.toml'} makes it a dense, which needs integers, floats or booleans; cast "
        "it to float64 where the file is written"
    )
    assert_one_line_error(refused, "^error: " + re.escape(said) + "$")


def test_a_parquet_float_past_float32_is_refused_in_its_one_line_alone(tmp_path: Path):
    """Before, numpy's "RuntimeWarning: overflow encountered in cast" and the source line under it
    came first on stderr (a Parquet value reaches the message as a Python float, which numpy cast
    to float32 to compare it with float32's largest): three lines, two of them about our code."""
    price = [i + 0.5 for i in range(60)] + [1e300]
    pq.write_table(pa.table({"rating": [i % 5 + 1 for i in range(61)], "price": price,
                             "site": ["s"] * 61}), tmp_path / "log.parquet")  # fmt: skip
    (tmp_path / "s.toml").write_text(
        SPEC.replace('type = "float"', 'type = "float"\ntransform = "none"')
    )
    refused = cli_process(["preprocess", "log.parquet", "--spec", "s.toml", "--out", "o"],
                          tmp_path, ok=False)  # fmt: skip
    assert_one_line_error(
        refused,
        r"^error: log\.parquet: row 61: price: 1e\+300 is past what float32 holds with transform "
        r'none: it would train as infinity; give price transform = "signed-log1p" in the spec$',
    )
