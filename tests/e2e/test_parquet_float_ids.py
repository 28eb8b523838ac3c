"""A Parquet float column of ids, as pandas writes an integer column that has nulls (float64:
int64 has no null), read by an integer categorical: each whole number is the integer it is, so a
log gives the ids it gives written as integers or as CSV (`66740.0`); a float that is no id (a
fraction, a NaN, an infinity, a value at or past the float type's last exact integer, where floats
skip integers: 2^53 for float64, 2^24 for float32, 2^11 for float16) is a malformed row named by
file, row, column and value."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_one_line_error, cli

from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.format.part_file import open_split

SPEC = """[format]
kind = "{kind}"
{header}
[[columns]]
name = "click"
role = "label"

[[columns]]
name = "item_id"
role = "categorical"
kind = "integer"
hash_size = 1000
"""


def _spec(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / f"{kind}.toml"
    path.write_text(SPEC.format(kind=kind, header="header = true\n" if kind == "csv" else ""))
    return path


def _ids(directory: Path) -> np.ndarray:
    manifest = Manifest.load(directory)
    return np.concatenate(
        [p.sparse["item_id"] for s in manifest.splits for p in open_split(directory, s, manifest)]
    )


def _log(rows: int = 300) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    item = rng.integers(10**4, 10**5, rows).astype(float)
    item[::10] = np.nan
    return pd.DataFrame({"click": rng.integers(0, 2, rows), "item_id": item})


def test_float_ids_are_the_ids_of_the_same_log_written_as_integers_or_as_csv(tmp_path: Path):
    # They were refused ("column 'item_id' is double in the Parquet file; ... needs an integer
    # column (kind = "string" hashes text)"), and spec infer proposed them dense, log1p(item_id).
    log = _log()
    log.to_parquet(tmp_path / "floats.parquet", index=False)
    log.astype({"item_id": "Int64"}).to_parquet(tmp_path / "ints.parquet", index=False)
    log.to_csv(tmp_path / "floats.csv", index=False)
    assert pd.read_parquet(tmp_path / "floats.parquet")["item_id"].dtype == np.float64
    for raw in ([], ["--raw-ids", "all"]):
        made = {}
        for name in ("floats.parquet", "ints.parquet", "floats.csv"):
            out = tmp_path / f"{name}{len(raw)}"
            spec = _spec(tmp_path, name.split(".")[1])
            cli("preprocess", tmp_path / name, "--spec", spec, "--out", out, *raw)
            made[name] = _ids(out)
        assert (made["floats.parquet"] == made["ints.parquet"]).all()
        assert (made["floats.parquet"] == made["floats.csv"]).all()
    assert 66740 not in made["ints.parquet"] and int(log["item_id"][1]) in made["ints.parquet"]
    # A log whose parts pandas wrote with and without nulls: the two files are one run.
    both = tmp_path / "both"
    cli("preprocess", tmp_path / "ints.parquet", tmp_path / "floats.parquet",
        "--spec", _spec(tmp_path, "parquet"), "--out", both)  # fmt: skip
    assert len(_ids(both)) == 2 * len(log)


def test_a_float_that_is_no_id_is_a_malformed_row_naming_file_row_column_and_value(tmp_path):
    log = _log()
    log.loc[[1, 2, 3, 4], "item_id"] = [66740.5, np.inf, 2.0**60, 2.0**53]
    log.to_parquet(tmp_path / "log.parquet", index=False)
    spec, where = _spec(tmp_path, "parquet"), tmp_path / "log.parquet"
    res = json.loads(cli("preprocess", where, "--spec", spec, "--out", tmp_path / "o",
                         "--max-skipped-fraction", "0.05", "--json").stdout)  # fmt: skip
    assert res["rows_skipped"] == {"bad_integer": 4}
    assert res["first_errors"] == [
        f"{where}: row 2: item_id: 66740.5 (bad_integer)",
        f"{where}: row 3: item_id: inf (bad_integer)",
        f"{where}: row 4: item_id: 1.152921504606847e+18 (bad_integer)",
        f"{where}: row 5: item_id: 9007199254740992.0 (bad_integer)",
    ]
    strict = ["preprocess", where, "--spec", spec, "--out", tmp_path / "s", "--strict"]
    assert_one_line_error(
        cli(*strict, ok=False),
        rf"^error: {where}: row 2: item_id: 66740.5 \(bad_integer\); item_id reads whole numbers, "
        r"a missing value as null: correct the row, write item_id as integers \(pandas: "
        r'\.astype\("Int64"\); a float64 is an id only as a whole number below 2\^53, from which '
        r"floats skip integers\), or leave out --strict to skip such rows",
    )


def _narrow_log(dtype: str, bound: int) -> pa.Table:
    """10 ids from a narrow float's bound (rows 1-10), then 50 below it."""
    ids = np.concatenate([bound + np.arange(10), bound - 50 + np.arange(50)])
    return pa.table({"click": np.arange(60) % 2, "item_id": pa.array(ids.astype(dtype))})


@pytest.mark.parametrize("dtype,bits", [("float32", 24), ("float16", 11)])
def test_a_narrow_float_id_at_its_types_bound_is_refused_not_merged(tmp_path, dtype, bits):
    # float32 holds every integer only below 2^24 (16777217 is written 16777216.0), float16 below
    # 2^11: the bound was float64's 2^53, and ids past the narrow one, which may have been
    # rounded into one another, were kept silently (a float32 log of 300 ids from 2^24 - 5 kept
    # all its rows and gave 153 items).
    where, bound = tmp_path / f"{dtype}.parquet", 2**bits
    pq.write_table(_narrow_log(dtype, bound), where)
    spec, out = _spec(tmp_path, "parquet"), tmp_path / "o"
    res = json.loads(cli("preprocess", where, "--spec", spec, "--out", out,
                         "--max-skipped-fraction", "0.2", "--json").stdout)  # fmt: skip
    assert res["rows_skipped"] == {"bad_integer": 10}
    assert res["first_errors"][0] == f"{where}: row 1: item_id: {float(bound)} (bad_integer)"
    assert sum(res["rows_kept"].values()) == len(_ids(out)) == 50
    assert_one_line_error(
        cli("preprocess", where, "--spec", spec, "--out", tmp_path / "s", "--strict", ok=False),
        rf"^error: {where}: row 1: item_id: {float(bound)} \(bad_integer\); .* a {dtype} is an id "
        rf"only as a whole number below 2\^{bits}, from which floats skip integers\)",
    )


@pytest.mark.parametrize("dtype,bits", [("float32", 24), ("float16", 11)])
def test_spec_infer_proposes_narrow_float_ids_as_integers_only_below_their_types_bound(
    tmp_path, dtype, bits
):
    # Proposed as integer ids up to 2^53 whatever the float's width: preprocess now refuses them.
    below = pa.table({"click": np.arange(60) % 2,
                      "item_id": pa.array((np.arange(60) + 2**bits - 61).astype(dtype))})  # fmt: skip
    pq.write_table(below, tmp_path / "below.parquet")
    proposed = cli("spec", "infer", tmp_path / "below.parquet", "--label", "click")
    assert proposed.stderr == ""
    assert 'name = "item_id"\nrole = "categorical"\nkind = "integer"' in proposed.stdout
    pq.write_table(_narrow_log(dtype, 2**bits), tmp_path / "at.parquet")
    proposed = cli("spec", "infer", tmp_path / "at.parquet", "--label", "click")
    assert proposed.stderr.startswith(
        f"warning: {tmp_path / 'at.parquet'}: item_id ({dtype}: exact only below 2^{bits}): whole "
        "numbers at or past that bound stored as floats under an id's name"
    )
    assert 'name = "item_id"\nrole = "dense"' in proposed.stdout
