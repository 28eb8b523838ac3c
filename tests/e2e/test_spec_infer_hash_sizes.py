"""`shardrec spec infer`'s hash sizes: a column of few values gets a table in which each value
seen has an id of its own (preprocessed with the spec as proposed, `data stats` counts as many
ids as values); a column of many values says how many of them share an id."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from helpers import cli

from shardrec.dataloader.spec.spec_file import load_spec

GENRES = ["Comedy", "Drama", "Action", "Thriller", "Romance", "Horror", "Sci-Fi", "Children's"]
"""MovieLens' genres: twice 8 values (16 rows) put Children's and Romance on one id."""
SITES = ["68fd1e64", "8cf07265", "287e684f", "05db9164", "be589b51", "5a9ed9b0", "f473b8dc"]
SITES += ["39af2607"]  # hex ids (Criteo's): two of them share an id in 16 rows
CITIES = ["paris", "berlin", "tokyo", "nyc", "rome", "oslo", "lima"]
TAGS = ["a", "b", "c", "d", "e", "f"]
C1 = [1005, 1002, 1010, 1001, 1007, 1012]  # Avazu's C1: codes written as integers


def _distinct_ids(data: Path) -> dict[str, int]:
    stats = json.loads(cli("data", "stats", data, "--json").stdout)
    return {f["feature"]: f["distinct_ids"] for f in stats["features"]}


def _preprocessed(log: Path, label: str, tmp_path: Path) -> tuple[dict[str, int], str]:
    """(distinct ids per feature, the spec's text) of `log` preprocessed with its spec as
    proposed."""
    spec, data = tmp_path / f"{log.stem}.toml", tmp_path / f"{log.stem}_data"
    cli("spec", "infer", log, "--label", label, "--out", spec)
    cli("preprocess", log, "--spec", spec, "--out", data, "--workers", "1")
    return _distinct_ids(data), spec.read_text()


def test_a_column_of_few_values_gets_an_id_per_value(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    log = tmp_path / "ratings.csv"
    rows = ["rating,genres,site,gender,user_id"]
    for i in range(2000):
        genres = "|".join(rng.choice(GENRES, rng.integers(1, 4), replace=False))
        rows.append(
            f"{rng.integers(1, 6)},{genres},{SITES[i % 8]},{'MF'[i % 2]},u{rng.integers(0, 3000)}"
        )
    log.write_text("\n".join(rows) + "\n")
    ids, text = _preprocessed(log, "rating>=4", tmp_path)
    assert (ids["genres"], ids["site"], ids["gender"]) == (8, 8, 2)
    spec = {c.name: c for c in load_spec(tmp_path / "ratings.toml").columns}
    assert spec["genres"].hash_size > 16 and spec["site"].kind == "hex"
    assert re.search(
        r"; hash_size \d+, not 16: at 16, 2 of the values seen would share an id", text
    )
    # Users the sample saw only some of: no size is looked for; the comment says how many share.
    assert re.search(r"; [\d,]+ of the [\d,]+ values seen share an id with another at this", text)


def test_a_parquet_column_of_few_values_gets_an_id_per_value(tmp_path: Path) -> None:
    """Strings, a list of strings, and integers (hashed from their value, not their text)."""
    rng = np.random.default_rng(4)
    n = 2000
    table = pa.table(
        {
            "click": pa.array(rng.integers(0, 2, n)),
            "city": pa.array([CITIES[i % 7] for i in range(n)]),
            "tags": pa.array(
                [list(rng.choice(TAGS, rng.integers(1, 4), replace=False)) for _ in range(n)],
                pa.list_(pa.string()),
            ),
            "C1": pa.array([C1[i % 6] for i in range(n)], pa.int64()),
        }
    )
    pq.write_table(table, tmp_path / "log.parquet")
    ids, _ = _preprocessed(tmp_path / "log.parquet", "click", tmp_path)
    assert ids == {"city": 7, "tags": 6, "C1": 6}
    assert load_spec(tmp_path / "log.toml").columns[3].kind == "integer"


def test_a_parquet_uint64_column_past_int64_gets_an_id_per_value(tmp_path: Path) -> None:
    # Before, the values of 2^63 and up were left out of the check (as an int64 text field would
    # refuse them): the comment said each value had its own id while 12 values had 10.
    rng = np.random.default_rng(0)
    values = rng.integers(2**63, 2**64 - 1, 6, dtype=np.uint64, endpoint=True).tolist()
    values += list(range(1, 7))
    n = 2000
    table = pa.table(
        {
            "click": pa.array(rng.integers(0, 2, n)),
            "user_id": pa.array([values[i % 12] for i in range(n)], pa.uint64()),
        }
    )
    pq.write_table(table, tmp_path / "log.parquet")
    ids, text = _preprocessed(tmp_path / "log.parquet", "click", tmp_path)
    assert ids == {"user_id": 12}, text
