"""Parquet click logs in: a feature spec of `kind = "parquet"` reads Parquet files and directories
of them through the same preprocessing as text (the rows a CSV of the same log gives), in parallel
over row groups with the same bytes at any worker count and after a rerun; `spec infer` proposes a
spec from a Parquet schema; bad columns and rows are one clear line."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import assert_one_line_error, cli

from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.format.part_file import open_split
from shardrec.dataloader.spec.feature_spec import (
    CategoricalColumn,
    DenseColumn,
    IgnoredColumn,
    LabelColumn,
    ListColumn,
)
from shardrec.dataloader.spec.spec_file import load_spec

ROWS = 3000
COLUMNS = """
[[columns]]
name = "click"
role = "label"

[[columns]]
name = "price"
role = "dense"
type = "float"

[[columns]]
name = "count"
role = "dense"
transform = "signed-log1p"

[[columns]]
name = "site"
role = "categorical"
kind = "string"
hash_size = 1000

[[columns]]
name = "user_id"
role = "categorical"
kind = "integer"
hash_size = 5000

[[columns]]
name = "ad"
role = "categorical"
kind = "hex"
hash_size = 5000

[[columns]]
name = "tags"
role = "list"
kind = "string"
hash_size = 100
max_length = 3
pooling = "mean"

[[columns]]
name = "note"
role = "ignore"
"""


def _log(rng: np.random.Generator, rows: int = ROWS) -> dict[str, list]:
    """A click log with every kind of column, nulls and empty values among them; `site` repeats
    (read as a dictionary), `ad` is nearly unique (read plain)."""

    def some(values: list, p: float) -> list:
        return [None if rng.random() < p else v for v in values]

    tags = [
        [rng.choice(["a", "b", "", "c", "dd", None]) for _ in range(rng.integers(0, 6))]
        for _ in range(rows)
    ]
    return {
        "click": rng.integers(0, 2, rows).tolist(),
        "price": some([round(float(x), 2) for x in rng.random(rows) * 100], 0.1),
        "count": rng.integers(-5, 100, rows).tolist(),
        "site": some([f"site-{x}" if x else "" for x in rng.integers(0, 40, rows)], 0.05),
        "user_id": some(rng.integers(-(10**12), 10**12, rows).tolist(), 0.05),
        "ad": [f"{x:012x}" for x in rng.integers(0, 2**48, rows)],
        "tags": some(tags, 0.05),
        "note": ["x"] * rows,
    }


def _write(log: dict[str, list], parquet: Path, text: Path | None = None) -> None:
    table = pa.table(
        {**log, "tags": pa.array(log["tags"], pa.list_(pa.string()))},
    )
    pq.write_table(table, parquet, row_group_size=700)  # several row groups, the last short
    if text is None:
        return
    with open(text, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(list(log))
        for r in range(len(log["click"])):
            row = [log[c][r] for c in log]
            row[6] = "|".join(t for t in (row[6] or []) if t)
            w.writerow(["" if v is None else v for v in row])


def _columns(directory: Path) -> dict[str, list[np.ndarray]]:
    """Each split's columns over its parts (labels, dense, ids, list lengths), in row order."""
    manifest = Manifest.load(directory)
    out = {}
    for split in manifest.splits:
        parts = open_split(directory, split, manifest)
        out[split] = [
            np.concatenate([p.labels for p in parts]),
            np.concatenate([p.dense for p in parts]),
            *(np.concatenate([p.sparse[n] for p in parts]) for n in manifest.feature_names),
            np.concatenate([np.diff(p.offsets["tags"]) for p in parts]),
        ]
    return out


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("parquet")
    _write(_log(np.random.default_rng(3)), root / "log.parquet", root / "log.csv")
    (root / "pq.toml").write_text('[format]\nkind = "parquet"\n' + COLUMNS)
    (root / "csv.toml").write_text('[format]\nkind = "csv"\nheader = true\n' + COLUMNS)
    return root


def test_a_parquet_log_gives_the_rows_a_csv_of_the_same_log_gives(logs: Path, tmp_path: Path):
    last = {}
    for kind in ("pq", "csv"):
        source = logs / ("log.parquet" if kind == "pq" else "log.csv")
        out = cli("preprocess", source, "--spec", logs / f"{kind}.toml", "--out", tmp_path / kind)
        last[kind] = out.stdout.strip().splitlines()[-1]
    # The summary says what was read: Parquet's columns are not text.
    assert re.match(
        rf"{ROWS:,} rows, [\d.]+ MB of Parquet columns \(uncompressed\); read at ", last["pq"]
    )
    assert re.match(rf"{ROWS:,} lines, [\d.]+ MB of text; parsed at ", last["csv"])
    ours, theirs = _columns(tmp_path / "pq"), _columns(tmp_path / "csv")
    assert list(ours) == list(theirs) == ["train", "val", "test"]
    for split in ours:
        for a, b in zip(ours[split], theirs[split]):
            assert a.dtype == b.dtype and np.array_equal(a, b), split
    lengths = ours["train"][-1]
    assert lengths.max() == 3 and (lengths == 0).any()  # max_length kept, empty lists kept empty
    manifest = Manifest.load(tmp_path / "pq")
    assert manifest.feature("tags").pooling == "mean" and manifest.feature("tags").multi_hot
    assert sum(s.rows for s in manifest.splits.values()) == ROWS
    assert cli("data", "verify", tmp_path / "pq").exit_code == 0


def test_row_groups_run_in_parallel_with_the_same_bytes_at_any_worker_count_and_after_a_rerun(
    logs: Path, tmp_path: Path
):
    def tree(directory: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*"))
            if p.is_file() and ".work" not in p.parts
        }

    args = ["--spec", logs / "pq.toml", "--chunk-mb", "0.02"]
    one = json.loads(cli("preprocess", logs / "log.parquet", "--out", tmp_path / "a", *args,
                         "--json").stdout)  # fmt: skip
    assert one["tasks_total"] >= 3  # tasks are runs of row groups
    cli("preprocess", logs / "log.parquet", "--out", tmp_path / "b", *args, "--workers", "2")
    assert tree(tmp_path / "a") == tree(tmp_path / "b")
    (tmp_path / "b" / ".work" / "task-00001.json").unlink()  # a task lost to a kill
    (tmp_path / "b" / "manifest.json").unlink()
    rerun = json.loads(cli("preprocess", logs / "log.parquet", "--out", tmp_path / "b", *args,
                           "--json").stdout)  # fmt: skip
    assert rerun["tasks_run"] == 1 and tree(tmp_path / "a") == tree(tmp_path / "b")


def test_a_directory_of_parquet_files_is_read_in_order_its_last_file_halved(tmp_path: Path):
    rng = np.random.default_rng(5)
    logs = tmp_path / "logs"
    logs.mkdir()
    days = [_log(rng, 400) for _ in range(3)]
    for d, log in enumerate(days):
        _write(log, logs / f"part-{d}.parquet")
    (logs / "README.txt").write_text("not a log")
    spec = tmp_path / "pq.toml"
    spec.write_text('[format]\nkind = "parquet"\n' + COLUMNS)
    cli("preprocess", logs, "--spec", spec, "--out", tmp_path / "data")
    manifest = Manifest.load(tmp_path / "data")
    assert {s: i.rows for s, i in manifest.splits.items()} == {
        "train": 800,
        "val": 200,
        "test": 200,
    }
    labels = np.concatenate([p.labels for p in open_split(tmp_path / "data", "train")])
    assert labels.tolist() == days[0]["click"] + days[1]["click"]


def test_a_polars_written_file_with_large_types_and_integer_lists_reads_the_same(tmp_path: Path):
    """polars writes large_string and large_list; a list of integers takes kind integer."""
    import polars as pl

    rng = np.random.default_rng(9)
    frame = pl.DataFrame(
        {
            "y": rng.integers(0, 2, 500),
            "s": [f"v{x}" for x in rng.integers(0, 30, 500)],
            "ids": [rng.integers(0, 50, rng.integers(0, 4)).tolist() for _ in range(500)],
        }
    )
    frame.write_parquet(tmp_path / "p.parquet")
    assert pq.read_schema(tmp_path / "p.parquet").field("s").type in (
        pa.large_string(),
        pa.string(),
    )
    spec = tmp_path / "s.toml"
    spec.write_text(
        '[format]\nkind = "parquet"\n[[columns]]\nname = "y"\nrole = "label"\n'
        '[[columns]]\nname = "s"\nrole = "categorical"\nhash_size = 64\n'
        '[[columns]]\nname = "ids"\nrole = "list"\nkind = "integer"\nhash_size = 64\n'
    )
    cli("preprocess", tmp_path / "p.parquet", "--spec", spec, "--out", tmp_path / "d")
    with open(tmp_path / "p.csv", "w") as f:
        f.write("y,s,ids\n")
        for y, s, ids in frame.iter_rows():
            f.write(f"{y},{s},{'|'.join(map(str, ids))}\n")
    text = spec.read_text().replace('kind = "parquet"', 'kind = "csv"\nheader = true')
    (tmp_path / "c.toml").write_text(text)
    cli("preprocess", tmp_path / "p.csv", "--spec", tmp_path / "c.toml", "--out", tmp_path / "c")
    for split in ("train", "val", "test"):
        a, b = open_split(tmp_path / "d", split), open_split(tmp_path / "c", split)
        for name in ("s", "ids"):
            got = np.concatenate([p.sparse[name] for p in a])
            assert np.array_equal(got, np.concatenate([p.sparse[name] for p in b])), name


def test_spec_infer_proposes_a_spec_from_a_parquet_schema_that_preprocesses_the_file(
    tmp_path: Path,
):
    rng = np.random.default_rng(2)
    log = _log(rng, 2000)
    log["ts"] = pa.array(rng.integers(0, 10**9, 2000) * 1000, pa.timestamp("ms"))
    # ids that repeat (a value in every row would be a row id, ignored)
    log["user_id"] = rng.integers(0, 500, 2000).tolist()
    log["ad"] = [f"{x:012x}" for x in rng.integers(0, 2**48, 300)[rng.integers(0, 300, 2000)]]
    _write(log, tmp_path / "log.parquet")
    spec_path = tmp_path / "inferred.toml"
    cli("spec", "infer", tmp_path / "log.parquet", "--label", "click", "--out", spec_path)
    spec = load_spec(spec_path)
    columns = {c.name: c for c in spec.columns}
    assert spec.format.kind == "parquet" and columns["click"] == LabelColumn("click")
    assert isinstance(columns["price"], DenseColumn) and columns["price"].type == "float"
    assert (
        isinstance(columns["count"], DenseColumn) and columns["count"].transform == "signed-log1p"
    )
    assert columns["user_id"].kind == "integer" and isinstance(
        columns["user_id"], CategoricalColumn
    )
    assert columns["ad"].kind == "hex" and columns["site"].kind == "string"
    assert isinstance(columns["tags"], ListColumn) and columns["tags"].kind == "string"
    assert isinstance(columns["ts"], IgnoredColumn)
    assert "timestamp[ms]: not a feature as it is" in spec_path.read_text()
    cli("preprocess", tmp_path / "log.parquet", "--spec", spec_path, "--out", tmp_path / "d")
    assert Manifest.load(tmp_path / "d").splits["train"].rows > 0


def test_bad_parquet_columns_and_rows_are_one_clear_line(logs: Path, tmp_path: Path):
    bad = (logs / "pq.toml").read_text()
    spec = tmp_path / "s.toml"
    spec.write_text(bad.replace('name = "site"\nrole = "categorical"\nkind = "string"',
                                'name = "site"\nrole = "categorical"\nkind = "integer"'))  # fmt: skip
    assert_one_line_error(
        cli("preprocess", logs / "log.parquet", "--spec", spec, "--out", tmp_path / "o", ok=False),
        r"log.parquet: column 'site' is string in the Parquet file; .* makes it a categorical "
        r"of kind integer, which needs an integer column",
    )
    spec.write_text(bad.replace('[[columns]]\nname = "note"\nrole = "ignore"\n', ""))
    assert_one_line_error(
        cli("preprocess", logs / "log.parquet", "--spec", spec, "--out", tmp_path / "o", ok=False),
        r"log.parquet: column 'note' is in no \[\[columns\]\] of .*; add it with role = \"ignore\"",
    )
    assert_one_line_error(
        cli(
            "preprocess",
            logs / "log.csv",
            "--spec",
            logs / "pq.toml",
            "--out",
            tmp_path / "o",
            ok=False,
        ),  # fmt: skip
        r"log.csv: not a Parquet file \(the spec reads Parquet",
    )
    # malformed rows: a null label, an ad that is not hex; skipped, counted and shown by row
    rng = np.random.default_rng(4)
    log = _log(rng, 300)
    log["click"][7] = None
    log["ad"][11] = "not-hex!"
    _write(log, tmp_path / "bad.parquet")
    refused = cli("preprocess", tmp_path / "bad.parquet", "--spec", logs / "pq.toml",
                  "--out", tmp_path / "b", ok=False)  # fmt: skip
    assert_one_line_error(
        refused,
        r"bad.parquet: 2 of 300 rows malformed \(0.67%: bad_label 1, bad_hex 1\), more than the "
        r"0.003 allowed \(--max-skipped-fraction\); first: .*bad.parquet: row 8: click: null",
    )
    res = json.loads(cli("preprocess", tmp_path / "bad.parquet", "--spec", logs / "pq.toml",
                         "--out", tmp_path / "b", "--max-skipped-fraction", "0.01",
                         "--json").stdout)  # fmt: skip
    assert res["rows_skipped"] == {"bad_label": 1, "bad_hex": 1}
    assert res["first_errors"] == [
        f"{tmp_path / 'bad.parquet'}: row 8: click: null (bad_label)",
        f"{tmp_path / 'bad.parquet'}: row 12: ad: 'not-hex!' (bad_hex)",
    ]
    assert_one_line_error(
        cli(
            "preprocess",
            tmp_path / "bad.parquet",
            "--spec",
            logs / "pq.toml",
            "--out",
            tmp_path / "s",
            "--strict",
            ok=False,
        ),  # fmt: skip
        r"bad.parquet: row 8: click: null \(bad_label\)",
    )


def test_vocabulary_mode_reads_parquet_as_it_reads_text(logs: Path, tmp_path: Path):
    for kind in ("pq", "csv"):
        source = logs / ("log.parquet" if kind == "pq" else "log.csv")
        cli("preprocess", source, "--spec", logs / f"{kind}.toml", "--out", tmp_path / kind,
            "--min-count", "2")  # fmt: skip
    ours, theirs = _columns(tmp_path / "pq"), _columns(tmp_path / "csv")
    for split in ours:
        for a, b in zip(ours[split], theirs[split]):
            assert np.array_equal(a, b), split
    shutil.rmtree(tmp_path / "csv")


def test_raw_parquet_rows_get_the_inputs_their_preprocessed_rows_have(logs: Path, tmp_path: Path):
    """`shardrec predict MODEL FILE.parquet` reads the file as preprocessing did (its model's
    transform records the spec): the same dense values and ids, row for row."""
    from shardrec.tools.preprocess.raw_rows import RawRows

    cli("preprocess", logs / "log.parquet", "--spec", logs / "pq.toml", "--out", tmp_path / "d")
    manifest = Manifest.load(tmp_path / "d")
    header = {
        "feature_names": manifest.feature_names,
        "transform": {
            "spec": manifest.options["spec"],
            "cardinalities": [f.cardinality for f in manifest.sparse_features],
            "mode": "hash",
        },
    }
    batches = list(RawRows(header).read(logs / "log.parquet"))
    parts = open_split(tmp_path / "d", "train", manifest)  # the file's first rows, in order
    train = sum(p.rows for p in parts)
    dense = np.concatenate([b[0][0] for b in batches])
    assert len(dense) == ROWS
    assert np.array_equal(dense[:train], np.concatenate([p.dense for p in parts]))
    for name in manifest.feature_names:
        if manifest.feature(name).multi_hot:
            lengths = np.concatenate([b[0][1][name][1] for b in batches])[:train]
            want = np.concatenate([np.diff(p.offsets[name]) for p in parts])
            assert np.array_equal(lengths, want), name
            continue
        ids = np.concatenate([b[0][1][name][0] for b in batches])[:train]
        assert np.array_equal(ids, np.concatenate([p.sparse[name] for p in parts])), name
    labels = np.concatenate([b[1] for b in batches])[:train]
    assert np.array_equal(labels, _columns(tmp_path / "d")["train"][0])

    # Rows without labels (--no-label): the label column gone from the file, or read past, a
    # column the model does not read left out, one it skipped gone; the same inputs, no labels.
    table = pq.read_table(logs / "log.parquet")
    unlabeled = table.drop_columns(["click", "note"]).append_column("extra", pa.array(["x"] * ROWS))
    pq.write_table(unlabeled, tmp_path / "new.parquet", row_group_size=1000)
    for source in (tmp_path / "new.parquet", logs / "log.parquet"):
        scored = list(RawRows(header).read(source, labeled=False))
        assert all(labels is None for _, labels in scored)
        assert np.array_equal(np.concatenate([b[0][0] for b in scored]), dense)
        for name in manifest.feature_names:
            got = np.concatenate([b[0][1][name][0] for b in scored])
            assert np.array_equal(got, np.concatenate([b[0][1][name][0] for b in batches])), name
    with pytest.raises(ValueError, match="no label column 'click'.*score them with --no-label"):
        list(RawRows(header).read(tmp_path / "new.parquet"))
    # A null label: the row is refused, and rows without labels are pointed at --no-label.
    labels = table.column("click").to_pylist()
    labels[5] = None
    nulls = table.set_column(table.schema.get_field_index("click"), "click", pa.array(labels))
    pq.write_table(nulls, tmp_path / "null.parquet")
    with pytest.raises(
        ValueError,
        match=r"null.parquet: row 6: click: null \(bad_label\) \(rows without labels\? score them with --no-label\)",
    ):
        list(RawRows(header).read(tmp_path / "null.parquet"))


def test_columns_are_read_as_dictionaries_by_their_first_dictionary_page(tmp_path: Path):
    """A string column repeats when its first row group's dictionary page holds under a quarter of
    its rows; one written without a dictionary page is read plain, however it repeats."""
    from shardrec.tools.preprocess.parse.parquet_schema import _repeating

    rng = np.random.default_rng(0)
    rows = 8000  # a row group several times the probe's rows
    site = [f"s{x}" for x in rng.integers(0, 50, rows)]
    table = pa.table({
        "click": rng.integers(0, 2, rows),
        "site": site,
        "ad": [f"{x:012x}" for x in rng.integers(0, 2**48, rows)],
        "plain_site": site,
        "few_then_many": [f"v{x % 10}" for x in range(1500)] + [f"w{x}" for x in range(rows - 1500)],
    })  # fmt: skip
    path = tmp_path / "log.parquet"
    dictionary = ["site", "ad", "few_then_many"]
    pq.write_table(table, path, row_group_size=rows, use_dictionary=dictionary)
    (tmp_path / "s.toml").write_text(
        '[format]\nkind = "parquet"\n\n[[columns]]\nname = "click"\nrole = "label"\n'
        + "".join(
            f'\n[[columns]]\nname = "{n}"\nrole = "categorical"\nhash_size = 100\n'
            for n in ("site", "ad", "plain_site", "few_then_many")
        )
    )
    assert _repeating(path, load_spec(tmp_path / "s.toml")) == ("site",)


def test_a_dictionary_page_that_filled_up_is_counted_over_its_row_group(tmp_path: Path):
    """400,000 near-unique strings in one row group: the writer's dictionary page fills (~88 k of
    them) and the rest is written plain; the column is counted whole, and read plain."""
    from shardrec.tools.preprocess.parse.parquet_schema import _repeating

    rows = 400_000
    rng = np.random.default_rng(1)
    table = pa.table({
        "click": np.zeros(rows, np.int8),
        "ad": pa.array(np.char.mod("%08x", rng.integers(0, 2**32, rows)).astype(object)),
        "site": pa.array(np.char.mod("s%d", rng.integers(0, 500, rows)).astype(object)),
    })  # fmt: skip
    path = tmp_path / "log.parquet"
    pq.write_table(table, path, row_group_size=rows)
    (tmp_path / "s.toml").write_text(
        '[format]\nkind = "parquet"\n\n[[columns]]\nname = "click"\nrole = "label"\n'
        + "".join(
            f'\n[[columns]]\nname = "{n}"\nrole = "categorical"\nhash_size = 100\n'
            for n in ("ad", "site")
        )
    )
    assert _repeating(path, load_spec(tmp_path / "s.toml")) == ("site",)


def test_a_column_of_nulls_only_is_read_as_missing_values_as_a_typed_one(logs: Path, tmp_path):
    # A day whose field was never logged: pandas writes a column of None as Arrow's null type,
    # which was refused ("column 'site' is null in the Parquet file; ... needs a string column")
    # though a typed column of nulls reads as missing values; and beside a file of the same
    # columns with values ("its columns or their types differ"). The null label stays refused.
    log = _log(np.random.default_rng(5), 300)
    empty = ("price", "count", "site", "user_id", "ad", "tags")
    values = pa.table(log | {"tags": pa.array(log["tags"], pa.list_(pa.string()))})
    typed = values
    for name in empty:
        typed = typed.set_column(
            typed.column_names.index(name), name, pa.nulls(300, typed.schema.field(name).type)
        )
    untyped = pa.table({n: pa.nulls(300) if n in empty else typed.column(n) for n in log})
    parts = {}
    for name, nulls in (("typed", typed), ("untyped", untyped)):
        days = tmp_path / name
        days.mkdir()
        for file, table in (("a", values), ("b", nulls), ("c", nulls), ("d", values)):
            pq.write_table(table, days / f"{file}.parquet", row_group_size=100)
        pq.write_table(nulls, tmp_path / f"{name}.parquet", row_group_size=100)
        for source, out in ((days, f"{name}-days"), (tmp_path / f"{name}.parquet", name)):
            cli("preprocess", source, "--spec", logs / "pq.toml", "--out", tmp_path / out)
            manifest = Manifest.load(tmp_path / out)
            parts[out] = [p.sha256 for s in manifest.splits.values() for p in s.parts]
    assert parts["untyped"] == parts["typed"] and parts["untyped-days"] == parts["typed-days"]
    ids = _columns(tmp_path / "untyped")["train"]
    assert not ids[1].any() and not any(a.any() for a in ids[2:])  # dense 0, id 0, empty lists
    pq.write_table(untyped.set_column(0, "click", pa.nulls(300)), tmp_path / "nolabel.parquet")
    refused = cli("preprocess", tmp_path / "nolabel.parquet", "--spec", logs / "pq.toml",
                  "--out", tmp_path / "o", ok=False)  # fmt: skip
    assert_one_line_error(
        refused,
        r"nolabel.parquet: column 'click' is null in the Parquet file; .* makes it a label",
    )
