"""Parquet categoricals read as dictionaries (a repeating string column: each distinct value's id
made once) give the ids a CSV of the same rows gives, whatever the ids' size: 64-bit ids past
2^53 (a hash_size that large, raw ids), a null as the CSV's empty field; and the ones the README's
own computation of a string's value and a hashed row gives ("Feature spec reference")."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from helpers import CLICK_CITY, assert_one_line_error, cli

from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.format.part_file import open_split
from shardrec.dataloader.format.raw_ids import MISSING_KEY
from shardrec.dataloader.spec.spec_file import load_spec
from shardrec.tools.preprocess.parse.parquet_schema import _repeating

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_hashing() -> dict:
    """The README's functions of a value's ids (string_value, table_id), as a reader runs them."""
    section = README.read_text().split("### Feature spec reference", 1)[1].split("\n### ", 1)[0]
    names: dict = {}
    exec(re.search(r"```python\n(.*?)```", section, re.S).group(1), names)
    return names


COLUMNS = (
    "\n"
    + CLICK_CITY
    + """
[[columns]]
name = "dev"
role = "categorical"
kind = "hex"
hash_size = {size}
"""
)


def _write(
    root: Path, cities: list, devs: list, rows: int = 300, group_rows: int | None = None,
    from_dictionaries: bool = False, **more: list,
) -> Path:  # fmt: skip
    """The same rows as a dictionary-encoded Parquet file and as a CSV (a null: an empty field).
    more: other columns, whole. from_dictionaries: city and dev written from Arrow dictionaries,
    as pandas writes categoricals (each row group's dictionary is the whole one)."""
    log = {
        "click": [r % 2 for r in range(rows)],
        "city": [cities[r % len(cities)] for r in range(rows)],
        "dev": [devs[(r * 3) % len(devs)] for r in range(rows)],
        **more,
    }
    root.mkdir(exist_ok=True)
    table = pa.table(log)
    for name in ("city", "dev") if from_dictionaries else ():
        column = table.column(name).dictionary_encode()
        table = table.set_column(table.schema.get_field_index(name), name, column)
    pq.write_table(table, root / "log.parquet", use_dictionary=True, row_group_size=group_rows)
    with open(root / "log.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(list(log))
        w.writerows([["" if log[c][r] is None else log[c][r] for c in log] for r in range(rows)])
    return root


def _specs(root: Path, size: int, more: str = "") -> tuple[Path, Path]:
    columns = COLUMNS.format(size=size) + more
    (root / "pq.toml").write_text('[format]\nkind = "parquet"\n' + columns)
    (root / "csv.toml").write_text('[format]\nkind = "csv"\nheader = true\n' + columns)
    # Both categoricals are dictionary-encoded in the file and read as dictionaries.
    encodings = pq.read_metadata(root / "log.parquet").row_group(0).column(1).encodings
    assert "RLE_DICTIONARY" in encodings
    assert _repeating(root / "log.parquet", load_spec(root / "pq.toml")) == ("city", "dev")
    return root / "pq.toml", root / "csv.toml"


def _ids(directory: Path) -> dict[str, np.ndarray]:
    """Every split's one-hot id columns, in row order."""
    manifest = Manifest.load(directory)
    return {
        f"{split}/{name}": np.concatenate([p.sparse[name] for p in open_split(directory, split)])
        for split in manifest.splits
        for name in manifest.feature_names
    }


def _same_ids_as_csv(root: Path, size: int, *args: str) -> dict[str, np.ndarray]:
    pq_spec, csv_spec = _specs(root, size)
    out = root / f"out-{size}-{len(args)}"
    cli("preprocess", root / "log.parquet", "--spec", pq_spec, "--out", out / "pq", *args)
    cli("preprocess", root / "log.csv", "--spec", csv_spec, "--out", out / "csv", *args)
    ours, theirs = _ids(out / "pq"), _ids(out / "csv")
    assert list(ours) == list(theirs)
    for name in ours:
        assert ours[name].dtype == theirs[name].dtype == np.uint64, name
        assert np.array_equal(ours[name], theirs[name]), (name, ours[name][:4], theirs[name][:4])
    return ours


CITIES = ["paris", "tokyo", "berlin", None, ""]
DEVS = ["a6077b6d0f0ec9ad", "ff", None, "0a", "c0ffee0000000001"]


def test_dictionary_columns_give_the_csvs_ids_past_2_to_the_53(tmp_path: Path) -> None:
    """A hash_size of 2^62: ids past 2^53, which a float64 would round (and did: CSV
    11964214728595223981, Parquet 11964214728595224576)."""
    root = _write(tmp_path, CITIES, DEVS)
    ids = _same_ids_as_csv(root, 2**62)
    assert (ids["train/dev"] > 2**53).any() and (ids["train/city"] == 0).any()
    # The README's table_id of its string_value: before, it named the hash splitmix64 (whose
    # usual form adds a golden-ratio increment) and left the last word's padding unsaid.
    readme = _readme_hashing()
    row = readme["table_id"](readme["string_value"]("paris"), 2**62)
    assert row in ids["train/city"].tolist()
    assert readme["table_id"](0xA6077B6D0F0EC9AD, 2**62) in ids["train/dev"].tolist()


def test_row_groups_of_one_dictionary_give_the_csvs_ids_in_each(tmp_path: Path) -> None:
    """Written from dictionaries, every row group holds the same one (its entries decoded and
    their ids made once, then taken again): each row group's rows get the CSV's ids, the
    dictionary's empty entry and the nulls too."""
    root = _write(tmp_path, CITIES, DEVS, group_rows=70, from_dictionaries=True)
    assert pq.read_metadata(root / "log.parquet").num_row_groups == 5
    _same_ids_as_csv(root, 2**62)


def test_row_groups_whose_dictionaries_differ_only_in_order_or_one_entry_give_the_csvs_ids(
    tmp_path: Path,
) -> None:
    """Row groups of one size whose dictionaries differ from the last one's only in their order or
    in one entry (as files appended to by other writers hold): each is decoded anew, not taken
    for the one before it (whose entries' ids are kept for an equal one), and an equal one after
    a different one is taken again from its own entries."""
    cities = [["paris", "tokyo", "berlin", ""], ["tokyo", "paris", "berlin", ""],
              ["tokyo", "paris", "lyon", ""], ["paris", "tokyo", "berlin", ""]]  # fmt: skip
    devs = [["0a", "ff", "c0ffee0000000001", "A6077B6D"], ["ff", "0a", "c0ffee0000000001",
            "A6077B6D"], ["ff", "0a", "c0ffee0000000002", "a6077b6d"], ["0a", "ff",
            "c0ffee0000000001", "A6077B6D"]]  # fmt: skip
    rows = 40
    root = _write(tmp_path, ["x"], ["0"], rows=rows * len(cities))  # the CSV, rewritten below
    log: dict[str, list] = {"click": [], "city": [], "dev": []}
    with pq.ParquetWriter(root / "log.parquet", pa.schema([("click", pa.int64()),
                          ("city", pa.dictionary(pa.int32(), pa.string())),
                          ("dev", pa.dictionary(pa.int32(), pa.string()))])) as w:  # fmt: skip
        for city, dev in zip(cities, devs):
            idx = [None if r % 9 == 0 else (r * 7) % 4 for r in range(rows)]
            column = {n: pa.DictionaryArray.from_arrays(pa.array(idx, pa.int32()), pa.array(d))
                      for n, d in (("city", city), ("dev", dev))}  # fmt: skip
            w.write_table(pa.table({"click": [r % 2 for r in range(rows)], **column}))
            log["click"] += [r % 2 for r in range(rows)]
            log["city"] += [None if i is None else city[i] for i in idx]
            log["dev"] += [None if i is None else dev[i] for i in idx]
    assert pq.read_metadata(root / "log.parquet").num_row_groups == len(cities)
    with open(root / "log.csv", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(list(log))
        w.writerows(
            [
                ["" if log[c][r] is None else log[c][r] for c in log]
                for r in range(len(log["click"]))
            ]
        )
    # ids past 2^53 and raw ids: uint64 columns, as _same_ids_as_csv compares them
    _same_ids_as_csv(root, 2**62)
    _same_ids_as_csv(root, 1000, "--raw-ids", "all")


def test_dictionary_columns_keep_raw_ids_and_a_null_is_the_missing_key(tmp_path: Path) -> None:
    """--raw-ids: the values as written (past 2^53), and a null is the empty field's raw id
    (2^63), as in the CSV, not 0, which is a real id."""
    root = _write(tmp_path, CITIES, DEVS)
    ids = _same_ids_as_csv(root, 1000, "--raw-ids", "all")
    assert 0xA6077B6D0F0EC9AD in ids["train/dev"].tolist()
    # A string's raw id is the README's string_value of it: a join of one's own tables works.
    value = _readme_hashing()["string_value"]
    cities = {value(c) for c in ("paris", "tokyo", "berlin")}
    assert cities == set(ids["train/city"].tolist()) - {MISSING_KEY}
    assert (ids["train/dev"] == MISSING_KEY).any() and (ids["train/city"] == MISSING_KEY).any()
    assert not (ids["train/dev"] == 0).any()


def test_the_reserved_raw_id_in_a_dictionary_or_beside_one_is_refused_as_in_a_csv(
    tmp_path: Path,
) -> None:
    """8000000000000000 is the empty field's raw id: the CSV refuses it in one line naming the
    file, line and column; Parquet names the row, in a dictionary column (`dev`) and in a column
    read plain beside one (`ad`, near-unique), not reading it back as missing."""
    ad = [f"{r:016x}" for r in range(300)]
    ad[7] = "8000000000000000"
    ad_column = '\n[[columns]]\nname = "ad"\nrole = "categorical"\nkind = "hex"\n'
    for devs, where in (([*DEVS[:4], "8000000000000000"], r"dev"), (DEVS, r"ad")):
        root = _write(tmp_path / where, CITIES, devs, ad=ad)
        pq_spec, csv_spec = _specs(root, 1000, ad_column)
        row, line = (4, 5) if where == "dev" else (8, 9)
        for log, spec, place in (
            ("log.parquet", pq_spec, f": row {row}"),
            ("log.csv", csv_spec, f":{line}"),
        ):
            result = cli("preprocess", root / log, "--spec", spec, "--out", root / f"o-{log}",
                         "--raw-ids", "all", ok=False)  # fmt: skip
            assert_one_line_error(
                result,
                rf"^error: {re.escape(str(root / log))}{place}: {where}: 8000000000000000 \(this "
                "raw id marks an empty field in a dataset of raw ids",
            )
