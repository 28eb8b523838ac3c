"""A spec whose label column has neither a mapping nor a threshold reads it as 0/1; where the file
writes its labels otherwise (`true`/`false`, a 1-5 rating), the refusal says which key to give the
column: what `shardrec spec infer` proposes for its values."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_one_line_error, cli

SPEC = """[format]
kind = "csv"
header = true

[[columns]]
name = "clicked"
role = "label"
{rule}
[[columns]]
name = "city"
role = "categorical"
kind = "string"
hash_size = 100
"""
PARQUET_SPEC = """[format]
kind = "parquet"

[[columns]]
name = "rating"
role = "label"

[[columns]]
name = "city"
role = "categorical"
kind = "string"
hash_size = 100
"""


@pytest.mark.parametrize(
    ("label", "rule", "first"),
    [
        (lambda i: "true" if i % 3 == 0 else "false", 'mapping = { "true" = 1, "false" = 0 }',
         "'false'"),
        (lambda i: str(i % 5 + 1), "threshold = 3", "'2'"),
    ],
)  # fmt: skip
def test_a_label_written_otherwise_than_0_1_is_refused_naming_the_key(
    tmp_path: Path, label, rule: str, first: str
) -> None:
    """Before, the line ended at "first: log.csv:2: clicked: 'false' (bad_label)"."""
    log, spec = tmp_path / "log.csv", tmp_path / "s.toml"
    log.write_text("clicked,city\n" + "".join(f"{label(i)},c{i % 7}\n" for i in range(1, 201)))
    spec.write_text(SPEC.format(rule=""))
    refused = cli("preprocess", log, "--spec", spec, "--out", tmp_path / "o", ok=False)
    said = (
        f"first: {log}:2: clicked: {first} (bad_label); the spec reads label column 'clicked' as "
        f"0 and 1: give it {rule} (what `shardrec spec infer` proposes for its values)"
    )
    assert_one_line_error(refused, re.escape(said) + "$")
    inferred = tmp_path / "inferred.toml"
    label_name = "clicked>=3" if rule.startswith("threshold") else "clicked"
    cli("spec", "infer", log, "--label", label_name, "--out", inferred)
    assert rule in inferred.read_text()
    spec.write_text(SPEC.format(rule=rule + "\n"))  # the advice taken: every row is kept
    res = json.loads(
        cli("preprocess", log, "--spec", spec, "--out", tmp_path / "o2", "--json").stdout
    )
    assert res["rows_skipped"] == {} and sum(res["rows_kept"].values()) == 200


def test_a_parquet_rating_label_is_refused_naming_a_threshold(tmp_path: Path) -> None:
    """Before, the line ended at "first: log.parquet: row 1: rating: 2 (bad_label)"."""
    log, spec = tmp_path / "log.parquet", tmp_path / "s.toml"
    ratings = [None if i % 60 == 0 else i % 5 + 1 for i in range(1, 301)]
    pq.write_table(pa.table({"rating": ratings, "city": [f"c{i % 7}" for i in range(300)]}), log)
    spec.write_text(PARQUET_SPEC)
    refused = cli("preprocess", log, "--spec", spec, "--out", tmp_path / "o", ok=False)
    said = (
        f"first: {log}: row 1: rating: 2 (bad_label); the spec reads label column 'rating' as 0 "
        "and 1: give it threshold = 3 (what `shardrec spec infer` proposes for its values)"
    )
    assert_one_line_error(refused, re.escape(said) + "$")


def test_strict_stops_at_the_first_bad_label_naming_the_key(tmp_path: Path) -> None:
    """Before, --strict's line ended at the row: "log.csv:3: clicked: '2' (bad_label)"."""
    log, spec, table = tmp_path / "log.csv", tmp_path / "s.toml", tmp_path / "log.parquet"
    log.write_text("clicked,city\n" + "".join(f"{i % 5 + 1},c{i % 7}\n" for i in range(200)))
    spec.write_text(SPEC.format(rule=""))
    ratings = [i % 5 + 1 for i in range(1, 301)]
    pq.write_table(pa.table({"rating": ratings, "city": [f"c{i % 7}" for i in range(300)]}), table)
    (tmp_path / "p.toml").write_text(PARQUET_SPEC)
    advice = "give it threshold = 3 (what `shardrec spec infer` proposes for its values)"
    for path, s, row, name, value in (
        (log, spec, ":3", "clicked", "'2'"),
        (table, tmp_path / "p.toml", ": row 1", "rating", "2"),
    ):
        refused = cli("preprocess", path, "--spec", s, "--out", tmp_path / name, "--strict",
                      "--workers", "2", ok=False)  # fmt: skip
        said = (
            f"error: {path}{row}: {name}: {value} (bad_label); the spec reads label column "
            f"{name!r} as 0 and 1: {advice}"
        )
        assert_one_line_error(refused, "^" + re.escape(said) + "$")
