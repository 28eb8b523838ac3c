"""Integer ids of 19 digits (Snowflake-style ids, most of int64's range) in a text log: read as the
integers they are, as the same log's Parquet int64 column is; past int64 a malformed row."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from helpers import cli

from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.format.part_file import open_split

SPEC = """columns = [
  { name = "click", role = "label" },
  { name = "user_id", role = "categorical", kind = "integer", hash_size = 5000 },
  { name = "item_id", role = "categorical", kind = "integer", hash_size = 5000 },
]
"""
INT64_MAX = (1 << 63) - 1


def _ids(directory: Path) -> dict[str, np.ndarray]:
    manifest = Manifest.load(directory)
    parts = [p for s in manifest.splits for p in open_split(directory, s, manifest)]
    return {n: np.concatenate([p.sparse[n] for p in parts]) for n in manifest.feature_names}


def test_19_digit_integer_ids_in_text_read_as_parquets_int64_does(tmp_path: Path) -> None:
    # Before, a text field held at most 18 digits: every row with a 19-digit id was malformed
    # (bad_integer), while the same ids in a Parquet int64 column were read.
    rng = np.random.default_rng(0)
    users = rng.integers(10**18, INT64_MAX, 400, dtype=np.int64).tolist()
    users[:3] = [INT64_MAX, -INT64_MAX, 10**18]
    items = rng.integers(-(10**18) * 9, 10**18 * 9, 400, dtype=np.int64).tolist()
    clicks = rng.integers(0, 2, 400).tolist()
    table = {"click": clicks, "user_id": users, "item_id": items}
    pq.write_table(pa.table(table), tmp_path / "log.parquet")
    with open(tmp_path / "log.csv", "w", newline="") as f:
        csv.writer(f).writerows([list(table), *zip(*table.values())])
    (tmp_path / "pq.toml").write_text(SPEC + '[format]\nkind = "parquet"\n')
    (tmp_path / "csv.toml").write_text(SPEC + '[format]\nkind = "csv"\nheader = true\n')
    for kind, source in (("pq", "log.parquet"), ("csv", "log.csv")):
        cli("preprocess", tmp_path / source, "--spec", tmp_path / f"{kind}.toml",
            "--out", tmp_path / kind, "--raw-ids", "user_id")  # fmt: skip
    text, parquet = _ids(tmp_path / "csv"), _ids(tmp_path / "pq")
    assert len(text["user_id"]) == 400
    assert text["user_id"].view(np.int64).tolist() == users  # raw ids: the integers themselves
    for name in ("user_id", "item_id"):
        assert np.array_equal(text[name], parquet[name]), name


def test_an_integer_past_int64_is_a_malformed_row(tmp_path: Path) -> None:
    (tmp_path / "csv.toml").write_text(SPEC + '[format]\nkind = "csv"\nheader = true\n')
    rows = ["click,user_id,item_id", "1,9223372036854775807,1", "0,9223372036854775808,2"]
    rows += [f"{i % 2},{i},{i}" for i in range(100)]
    (tmp_path / "log.csv").write_text("\n".join(rows) + "\n")
    result = cli("preprocess", tmp_path / "log.csv", "--spec", tmp_path / "csv.toml",
                 "--out", tmp_path / "out", ok=False)  # fmt: skip
    assert result.exit_code == 1
    assert "log.csv:3: user_id: '9223372036854775808' (bad_integer)" in result.output
