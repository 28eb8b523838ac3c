"""The same log as CSV and as Parquet: `spec infer` proposes `kind = "string"` for a CSV's
categorical of decimal integers (hashed as written; the Avazu and MovieLens datasets pinned in
test_preprocess_spec.py are made so) and `kind = "integer"` for Parquet's integer column of
them, so the two datasets get other ids. The CSV column's comment now gives the edit that makes
them one: `kind = "integer"` with the hash_size Parquet's spec gets. Before, the comment said
nothing of it, and the hash_size fitted to strings differed too (85 and 108 below)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
from helpers import cli

from shardrec.dataloader.format.part_file import open_split

SPLITS = ("train", "val", "test")

_EDIT = re.compile(
    r'kind = "integer" with hash_size = (\d+) gives the ids that spec infer proposes'
)


def _parts(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.glob("*/part-*"))}


def _edited(text: str) -> str:
    """The CSV's spec with each column's edit its comment gives applied."""
    out, size = [], None
    for line in text.splitlines():
        if line.startswith("# ") and (found := _EDIT.search(line)):
            size = found.group(1)
        elif size and line == 'kind = "string"':
            line = 'kind = "integer"'
        elif size and line.startswith("hash_size = "):
            line, size = f"hash_size = {size}", None
        out.append(line)
    return "\n".join(out) + "\n"


def test_the_csv_comment_gives_the_edit_that_makes_its_ids_parquets(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    n = 500
    df = pd.DataFrame(
        {
            "click": rng.integers(0, 2, n),
            "user_id": rng.integers(0, 100_000, n),
            "C14": rng.integers(1000, 30_000, n),
            "hour": 14102100 + rng.integers(0, 24, n),
            "age": rng.integers(18, 70, n),
        }
    )
    log_csv, log_pq = tmp_path / "log.csv", tmp_path / "log.parquet"
    df.to_csv(log_csv, index=False)
    df.to_parquet(log_pq, index=False)
    for log in (log_csv, log_pq):
        cli(
            "spec", "infer", log, "--label", "click", "--out", log.with_suffix(f"{log.suffix}.toml")
        )
    csv_spec = (tmp_path / "log.csv.toml").read_text()
    assert len(_EDIT.findall(csv_spec)) == 3  # user_id, C14, hour; not age (dense)
    edited = tmp_path / "edited.toml"
    edited.write_text(_edited(csv_spec))
    runs = {
        "csv": (log_csv, tmp_path / "log.csv.toml"),
        "edited": (log_csv, edited),
        "parquet": (log_pq, tmp_path / "log.parquet.toml"),
    }
    for name, (log, spec) in runs.items():
        cli("preprocess", log, "--spec", spec, "--out", tmp_path / name)
    parquet = _parts(tmp_path / "parquet")
    assert _parts(tmp_path / "edited") == parquet
    assert _parts(tmp_path / "csv") != parquet  # as proposed, the two differ


def test_ids_that_pandas_wrote_as_floats_are_proposed_as_the_integer_categorical_they_are(
    tmp_path: Path,
) -> None:
    # An integer column with nulls is float64 in pandas: its ids were proposed as a dense number,
    # log1p(item_id), with a warning to write the column as integers and infer again, where the
    # same log as CSV (`66740.0`) was proposed as integer ids. Now both are: the spec of the file
    # with nulls and of the one without are one, and give one item one id.
    rng = np.random.default_rng(0)
    item = rng.integers(10**6, 10**7, 400).astype(float)
    item[::10] = np.nan
    log = pd.DataFrame({"click": rng.integers(0, 2, 400), "item_id": item,
                        "price": rng.random(400) * 10, "site": ["a", "b"] * 200})  # fmt: skip
    log.to_parquet(tmp_path / "floats.parquet", index=False)
    log["item_id"] = log["item_id"].astype("Int64")
    log.to_parquet(tmp_path / "ints.parquet", index=False)
    texts, specs = {}, {}
    for name in ("floats", "ints"):
        proposed = cli("spec", "infer", tmp_path / f"{name}.parquet", "--label", "click")
        assert proposed.stderr == ""
        assert 'name = "item_id"\nrole = "categorical"\nkind = "integer"' in proposed.stdout
        texts[name] = proposed.stdout
        specs[name] = [line for line in proposed.stdout.splitlines() if not line.startswith("#")]
    assert specs["floats"] == specs["ints"]
    assert f'kind = "integer" reads {item[1]} as {int(item[1])}, the id' in texts["floats"]
    # Past 2^53 floats skip integers: such ids may have been rounded, and are said in a warning.
    log["item_id"] = log["item_id"].astype(float) * 2**40
    log.to_parquet(tmp_path / "large.parquet", index=False)
    proposed = cli("spec", "infer", tmp_path / "large.parquet", "--label", "click")
    assert proposed.stderr.startswith(
        f"warning: {tmp_path / 'large.parquet'}: item_id (float64: exact only below 2^53): whole "
        "numbers at or past that bound stored as floats under an id's name"
    )
    assert 'name = "item_id"\nrole = "dense"' in proposed.stdout


def test_csv_ids_written_with_a_zero_fraction_are_the_ids_written_without(tmp_path: Path) -> None:
    # pandas writes an integer column that has nulls as 66740.0: proposed as strings, hashed as
    # written, a day written with nulls and one without gave one item two ids.
    rng = np.random.default_rng(1)
    item = rng.integers(10**4, 10**5, 300).astype(float)
    item[::10] = np.nan
    log = pd.DataFrame({"click": rng.integers(0, 2, 300), "item_id": item})
    log.to_csv(tmp_path / "nulls.csv", index=False)
    whole = log.dropna().astype({"item_id": "int64"})
    whole.to_csv(tmp_path / "whole.csv", index=False)
    assert ".0," in (tmp_path / "nulls.csv").read_text().replace("\n", ",")
    proposed = cli("spec", "infer", tmp_path / "nulls.csv", "--label", "click").stdout
    assert 'name = "item_id"\nrole = "categorical"\nkind = "integer"' in proposed
    assert 'written with ".0" (as pandas writes an integer column that has nulls)' in proposed
    (tmp_path / "spec.toml").write_text(proposed)
    ids = {}
    for name in ("nulls", "whole"):
        cli("preprocess", tmp_path / f"{name}.csv", "--spec", tmp_path / "spec.toml",
            "--out", tmp_path / name)  # fmt: skip
        ids[name] = np.concatenate(  # every split's, in the file's row order
            [p.sparse["item_id"] for s in SPLITS for p in open_split(tmp_path / name, s)]
        )
    assert np.array_equal(ids["nulls"][ids["nulls"] != 0], ids["whole"])
