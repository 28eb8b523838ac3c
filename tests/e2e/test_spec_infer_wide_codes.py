"""Codes wider than 64 bits (an MD5's 32 hex digits, a 19-digit id) are proposed as string
categoricals, never as hex ones that preprocessing cannot decode, so the proposed spec
preprocesses the file it was inferred from: CSV and Parquet."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from helpers import cli

from shardrec.dataloader.spec.spec_file import load_spec

ROWS = 300


def _log(rng: np.random.Generator) -> dict[str, list]:
    users = [int(u) for u in rng.integers(10**18, 2 * 10**18, 40)]
    return {
        "click": [i % 2 for i in range(ROWS)],
        "user_id": [str(users[i]) for i in rng.integers(0, 40, ROWS)],
        "device": [hashlib.md5(str(i).encode()).hexdigest() for i in rng.integers(0, 50, ROWS)],
        "site": [f"{i:08x}" for i in rng.integers(0, 2**32, ROWS)],  # within 16 digits: hex
    }


def _proposed(path: Path, tmp_path: Path) -> dict[str, str]:
    cli("spec", "infer", path, "--label", "click", "--out", tmp_path / "s.toml")
    spec = load_spec(tmp_path / "s.toml")
    res = json.loads(cli("preprocess", path, "--spec", tmp_path / "s.toml", "--out",
                         tmp_path / "o", "--json").stdout)  # fmt: skip
    assert res["rows_skipped"] == {}
    return {c.name: getattr(c, "kind", c.role) for c in spec.columns}


def test_wide_hex_and_19_digit_ids_are_string_categoricals_that_preprocess(tmp_path: Path):
    log = _log(np.random.default_rng(5))
    text = tmp_path / "log.csv"
    text.write_text(
        "click,user_id,device,site\n"
        + "".join(f"{a},{b},{c},{d}\n" for a, b, c, d in zip(*log.values()))
    )
    kinds = _proposed(text, tmp_path / "csv")
    assert kinds == {"click": "label", "user_id": "string", "device": "string", "site": "hex"}


def test_a_parquet_list_of_wide_hex_values_is_a_string_list_that_preprocesses(tmp_path: Path):
    log = _log(np.random.default_rng(6))
    devices = [[d, d[::-1]] for d in log["device"]]
    pq.write_table(
        pa.table({"click": log["click"], "devices": devices, "sites": [[s] for s in log["site"]]}),
        tmp_path / "log.parquet",
    )
    kinds = _proposed(tmp_path / "log.parquet", tmp_path)
    assert kinds == {"click": "label", "devices": "string", "sites": "hex"}


def test_a_parquet_column_of_19_digit_integer_ids_is_an_integer_categorical(tmp_path: Path):
    log = _log(np.random.default_rng(7))
    pq.write_table(
        pa.table({"click": log["click"], "user_id": [int(u) for u in log["user_id"]]}),
        tmp_path / "log.parquet",
    )
    kinds = _proposed(tmp_path / "log.parquet", tmp_path)
    assert kinds == {"click": "label", "user_id": "integer"}


def test_digits_other_than_ascii_are_strings_not_numbers_preprocessing_refuses(tmp_path: Path):
    # Python's \d and int() take Arabic-Indic digits ('٤٣٢'); preprocessing reads ASCII digits
    # only, so the proposed float dense column was refused on every row (bad_float 300).
    digits = "٠١٢٣٤٥٦٧٨٩"
    rng = np.random.default_rng(8)
    qty = ["".join(digits[int(c)] for c in str(n)) for n in rng.integers(0, 500, ROWS)]
    text = tmp_path / "log.csv"
    text.write_text("click,qty\n" + "".join(f"{i % 2},{q}\n" for i, q in enumerate(qty)))
    assert _proposed(text, tmp_path) == {"click": "label", "qty": "string"}
