"""Integer ids in a text log, from -2^63 to 2^64 - 1 (Snowflake-style ids of 19 digits, ids that are
themselves 64-bit hashes): read as the 64 bits a Parquet int64 or uint64 column of the same values
holds, so the ids are the same from either file in hashing, vocabulary and raw-id mode, plain text
or gzip, one task or a split on two workers; past that range a malformed row."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_one_line_error, cli

from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.format.part_file import open_split

COLUMNS = """columns = [
  { name = "click", role = "label" },
  { name = "user_id", role = "categorical", kind = "integer", hash_size = 5000 },
  { name = "item_id", role = "categorical", kind = "integer", hash_size = 5000 },
  { name = "tags", role = "list", kind = "integer", separator = "|", max_length = 3, hash_size = 900 },
]
"""
CSV_SPEC = COLUMNS + '[format]\nkind = "csv"\nheader = true\n'
MASK = (1 << 64) - 1
INT64_MAX = (1 << 63) - 1


def _ids(directory: Path) -> dict[str, np.ndarray]:
    manifest = Manifest.load(directory)
    parts = [p for s in manifest.splits for p in open_split(directory, s, manifest)]
    return {n: np.concatenate([p.sparse[n] for p in parts]) for n in manifest.feature_names}


def _part_digests(directory: Path) -> list[str]:
    manifest = json.loads((directory / "manifest.json").read_text())
    return [p["sha256"] for s in manifest["splits"].values() for p in s["parts"]]


def _write_log(tmp_path: Path, missing_key: bool) -> dict[str, list[int]]:
    """log.parquet (user_id uint64, item_id int64, tags list<uint64>), log.csv and log.csv.gz of the
    same 400 rows. missing_key: among the ids, 2^63 and -2^63 (a raw id's empty value)."""
    rng = np.random.default_rng(0)
    users = rng.integers(0, MASK, 400, dtype=np.uint64, endpoint=True).tolist()
    users[:4] = [MASK, MASK - 1, INT64_MAX + 6, 10**18]
    items = rng.integers(-INT64_MAX, INT64_MAX, 400, dtype=np.int64, endpoint=True).tolist()
    items[:3] = [-1, -INT64_MAX, INT64_MAX]
    if missing_key:
        users[5], items[5] = INT64_MAX + 1, -INT64_MAX - 1
    tags = [[MASK - t, t] for t in rng.integers(0, 40, 400).tolist()]
    clicks = rng.integers(0, 2, 400).tolist()
    pq.write_table(
        pa.table(
            {
                "click": pa.array(clicks, pa.int64()),
                "user_id": pa.array(users, pa.uint64()),
                "item_id": pa.array(items, pa.int64()),
                "tags": pa.array(tags, pa.list_(pa.uint64())),
            }
        ),
        tmp_path / "log.parquet",
    )
    rows = zip(clicks, users, items, ("|".join(map(str, t)) for t in tags))
    with open(tmp_path / "log.csv", "w", newline="") as f:
        csv.writer(f).writerows([["click", "user_id", "item_id", "tags"], *rows])
    (tmp_path / "log.csv.gz").write_bytes(gzip.compress((tmp_path / "log.csv").read_bytes()))
    (tmp_path / "pq.toml").write_text(COLUMNS + '[format]\nkind = "parquet"\n')
    (tmp_path / "csv.toml").write_text(CSV_SPEC)
    return {"user_id": users, "item_id": items}


@pytest.mark.parametrize(
    "mode",
    [[], ["--min-count", "1"], ["--raw-ids", "user_id,item_id"]],
    ids=["hash", "vocab", "raw"],
)
def test_64_bit_integer_ids_in_text_are_parquets_ids(tmp_path: Path, mode: list[str]) -> None:
    # Before, a text field held an integer within +-(2^63 - 1): every row with a uint64 id past it
    # (18446744073709551615) or with -2^63 was malformed (bad_integer), where Parquet read them.
    written = _write_log(tmp_path, missing_key=not mode or mode[0] != "--raw-ids")
    small = ["--chunk-mb", "0.002"]  # about 13 tasks: the split of one file, plain and gzip
    runs = {
        "pq": ("log.parquet", "pq.toml", []),
        "text": ("log.csv", "csv.toml", [*small, "--workers", "1"]),
        "gz": ("log.csv.gz", "csv.toml", [*small, "--workers", "2"]),
    }
    for out, (source, spec, flags) in runs.items():
        cli("preprocess", tmp_path / source, "--spec", tmp_path / spec, "--out", tmp_path / out,
            *mode, *flags)  # fmt: skip
    text, parquet = _ids(tmp_path / "text"), _ids(tmp_path / "pq")
    assert len(text["user_id"]) == 400
    for name in ("user_id", "item_id", "tags"):
        assert np.array_equal(text[name], parquet[name]), name
    assert len(_part_digests(tmp_path / "text")) > 3
    assert _part_digests(tmp_path / "text") == _part_digests(tmp_path / "gz")
    if mode and mode[0] == "--raw-ids":  # the ids themselves: -1 and 2^64 - 1 are one id
        for name, values in written.items():
            assert sorted(text[name].tolist()) == sorted(v & MASK for v in values), name


@pytest.mark.parametrize(
    "value", ["18446744073709551616", "-9223372036854775809", "123456789012345678901"]
)
def test_an_integer_id_past_64_bits_is_a_malformed_row(tmp_path: Path, value: str) -> None:
    (tmp_path / "csv.toml").write_text(CSV_SPEC)
    rows = ["click,user_id,item_id,tags", "1,18446744073709551615,-9223372036854775808,1"]
    rows += [f"0,{value},2,3", *(f"{i % 2},{i},{i},{i}" for i in range(100))]
    (tmp_path / "log.csv").write_text("\n".join(rows) + "\n")
    result = cli("preprocess", tmp_path / "log.csv", "--spec", tmp_path / "csv.toml",
                 "--out", tmp_path / "out", ok=False)  # fmt: skip
    assert_one_line_error(
        result,
        f"first: \\S*/log\\.csv:3: user_id: '{value}' \\(bad_integer\\); user_id reads whole "
        'numbers, .* give user_id kind = "string" \\(any value, hashed\\), or skip such rows ',
    )


def test_a_raw_id_of_2_63_in_text_is_refused_as_parquets_is(tmp_path: Path) -> None:
    # 9223372036854775808 (2^63) and -9223372036854775808 are the bits of a raw id's empty value.
    _write_log(tmp_path, missing_key=True)
    for source, spec, where in (("log.csv", "csv.toml", "log.csv:7"),
                                ("log.parquet", "pq.toml", "log.parquet: row 6")):  # fmt: skip
        result = cli("preprocess", tmp_path / source, "--spec", tmp_path / spec,
                     "--out", tmp_path / f"{spec}.out", "--raw-ids", "user_id", ok=False)  # fmt: skip
        assert_one_line_error(
            result,
            f"^error: \\S*/{where}: user_id: 8000000000000000 \\(this raw id marks an empty ",
        )
