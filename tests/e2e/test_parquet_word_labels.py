"""A Parquet label column of two words (`yes`/`no`) is read through a mapping, as a CSV's is:
`spec infer` proposes it, and a spec without one is refused in a line that names it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from helpers import assert_one_line_error, cli

SPEC = """[format]
kind = "parquet"

[[columns]]
name = "clicked"
role = "label"

[[columns]]
name = "city"
role = "categorical"
kind = "string"
hash_size = 32
"""
NULLS_ALLOWED = ("--max-skipped-fraction", "0.05")  # a null label is a malformed row


def _log(tmp_path: Path) -> Path:
    path = tmp_path / "log.parquet"
    words = [None if i % 50 == 7 else "yes" if i % 4 == 0 else "no" for i in range(300)]
    cities = [f"c{i % 7}" for i in range(300)]
    pq.write_table(pa.table({"clicked": words, "city": cities}), path)
    return path


def test_spec_infer_proposes_a_mapping_for_a_parquet_label_of_words(tmp_path: Path) -> None:
    """Before: "error: log.parquet: label column 'clicked' is string; a label is a number (0/1,
    or any number with a threshold)", though preprocess reads such a column by a mapping."""
    log, spec = _log(tmp_path), tmp_path / "s.toml"
    cli("spec", "infer", log, "--label", "clicked", "--out", spec)
    assert '\nmapping = { "yes" = 1, "no" = 0 }\n' in spec.read_text()
    res = json.loads(
        cli(
            "preprocess", log, "--spec", spec, "--out", tmp_path / "o", "--json", *NULLS_ALLOWED
        ).stdout
    )
    assert sum(res["rows_kept"].values()) == 294 and res["rows_skipped"] == {"bad_label": 6}


def test_a_parquet_label_of_words_without_a_mapping_is_refused_naming_one(tmp_path: Path) -> None:
    log, spec = _log(tmp_path), tmp_path / "s.toml"
    spec.write_text(SPEC)
    said = (
        f"{log}: column 'clicked' is string in the Parquet file; {spec} makes it a label, which "
        "needs 0/1 as integers, booleans or floats (a string column wants a mapping of its two "
        'values, such as mapping = { "yes" = 1, "no" = 0 }: `shardrec spec infer` proposes it)'
    )
    refused = cli("preprocess", log, "--spec", spec, "--out", tmp_path / "o", ok=False)
    assert_one_line_error(refused, "^error: " + re.escape(said) + "$")
