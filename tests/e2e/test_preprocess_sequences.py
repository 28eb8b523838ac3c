"""A click log's sequence columns (a feature spec's `role = "sequence"`): the most recent values
kept, side sequences of the same length (times, actions kept as written, other ids hashed), a
candidate reading the history's table; a row whose side disagrees with its primary is skipped
and shown; the manifest says what each feature is, so a sequence model reads it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, cli

from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.loader import NO_SHUFFLE, build_loader
from shardrec.tools.preprocess.ids.id_maps import hash_ids

SPEC = """
[format]
kind = "csv"
header = true

[[columns]]
name = "label"
role = "label"

[[columns]]
name = "movie"
role = "categorical"
kind = "integer"
hash_size = 400
table = "history"

[[columns]]
name = "history"
role = "sequence"
kind = "integer"
hash_size = 400
max_length = 3

[[columns]]
name = "times"
role = "sequence"
kind = "integer"
side_of = "history"
values = "timestamps"

[[columns]]
name = "actions"
role = "sequence"
kind = "integer"
side_of = "history"
values = "integers"
"""
ROWS = [
    "label,movie,history,times,actions",
    "1,7,5|6|7|8|9,10|20|30|40|50,1|2|4|1|2",
    "0,3,,,",
    "1,9,9,99,4",
    "0,2,1|2,5|6|7,1|1",  # 3 times for 2 items: not a row
    "1,4,3|4,8|9,2|4",
]


def _preprocess(logs: Path, out: Path, ok: bool = True):
    """preprocess --spec, a fifth of the rows allowed malformed (the tests' own bad rows)."""
    args = ["--spec", logs / "spec.toml", "--out", out, "--max-skipped-fraction", "0.5"]
    return cli("preprocess", logs / "train.csv", *args, "--json", ok=ok)


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    (tmp_path / "train.csv").write_text("\n".join(ROWS) + "\n")
    (tmp_path / "spec.toml").write_text(SPEC)
    return tmp_path


def test_sequences_keep_their_latest_values_and_sides_share_their_lengths(logs: Path):
    out = logs / "data"
    result = json.loads(_preprocess(logs, out).stdout)
    assert result["rows_skipped"] == {"side_length": 1}
    assert result["first_errors"][0].endswith("train.csv:5: times: '5|6|7' (side_length)")
    manifest = Manifest.load(out)
    f = {x.name: x for x in manifest.sparse_features}
    assert (f["history"].sequence, f["history"].pooling, f["history"].table) == (True, "mean", "")
    assert (f["times"].side_of, f["times"].values, f["actions"].values) == (
        "history",
        "timestamps",
        "integers",
    )
    assert f["movie"].table == "history" and not f["movie"].sequence
    rows = {"history": ([], []), "times": ([], []), "actions": ([], [])}
    for split in ("train", "val", "test"):  # the rows in file order, across the splits
        n = manifest.splits[split].rows
        if not n:
            continue
        loader = build_loader(
            out, split, global_batch_size=n, rank=0, world_size=1, shuffle=NO_SHUFFLE
        )
        jt = loader.batch(0).sparse_features.to_dict()
        for name, (lengths, values) in rows.items():
            lengths += jt[name].lengths().tolist()
            values += jt[name].values().tolist()
    assert rows["history"][0] == rows["times"][0] == rows["actions"][0] == [3, 0, 1, 2]
    assert rows["times"][1] == [30, 40, 50, 99, 8, 9]
    assert rows["actions"][1] == [4, 1, 2, 4, 2, 4]
    items = np.array([7, 8, 9, 9, 3, 4], np.uint64)
    assert rows["history"][1] == hash_ids(items, np.zeros(6, bool), 400).tolist()


def test_a_negative_integer_in_a_sequence_kept_as_written_is_a_malformed_row(logs: Path):
    # Line 3 falls in train; the good rows after it fill every split.
    rows = [*ROWS[:2], "1,2,3|4,7|8,1|-2", *[ROWS[1]] * 8]
    (logs / "train.csv").write_text("\n".join(rows) + "\n")
    result = json.loads(_preprocess(logs, logs / "d").stdout)
    assert result["first_errors"][0].endswith("train.csv:3: actions: '1|-2' (bad_integer)")


def test_a_side_of_nothing_and_a_table_of_nothing_are_refused_in_one_line(logs: Path):
    (logs / "spec.toml").write_text(SPEC.replace('side_of = "history"', 'side_of = "histroy"', 1))
    result = cli(
        "preprocess",
        logs / "train.csv",
        "--spec",
        logs / "spec.toml",
        "--out",
        logs / "d",
        ok=False,
    )
    assert_one_line_error(
        result, r"column 'times': side_of = 'histroy' names no primary sequence column"
    )
    (logs / "spec.toml").write_text(SPEC.replace('table = "history"', 'table = "times"'))
    result = cli(
        "preprocess",
        logs / "train.csv",
        "--spec",
        logs / "spec.toml",
        "--out",
        logs / "d",
        ok=False,
    )
    assert_one_line_error(result, r"column 'movie': table = 'times' names no other column of ids")


def _head(logs: Path, rows: list[str]) -> tuple[dict, list[dict]]:
    """preprocess's --json report and the rows of `rows` it kept (data head --json of every
    split, the 8 good rows after them left out): `NA` a word for a missing value, history's ids
    kept as written."""
    (logs / "spec.toml").write_text(
        SPEC.replace("header = true", 'header = true\nmissing = ["NA"]')
    )
    (logs / "train.csv").write_text("\n".join([ROWS[0], *rows, *[ROWS[1]] * 8]) + "\n")
    out = logs / "d"
    result = json.loads(_preprocess_raw(logs, out).stdout)
    kept = []
    for split, info in Manifest.load(out).splits.items():
        if info.rows:
            head = cli("data", "head", out, "-n", "50", "--split", split, "--json").stdout
            kept += [r for r in json.loads(head) if r["history"] != ["7", "8", "9"]]
    return result, sorted(kept, key=lambda r: r["actions"])


def _preprocess_raw(logs: Path, out: Path):
    args = ["--spec", logs / "spec.toml", "--out", out, "--max-skipped-fraction", "0.5"]
    return cli("preprocess", logs / "train.csv", *args, "--raw-ids", "history", "--json")


def test_a_position_whose_item_is_missing_is_dropped_with_its_side_values(logs: Path):
    # An empty or NA item drops its time and action too, whatever they hold: each value stays
    # with its own item (before, the rows were side_length: 4 actions for 3 items). The last three
    # positions left are kept.
    rows = ["1,7,11|NA|33|44,100|NA|300|400,1|2|3|4", "0,7,NA|22||44|55,1|2|3|4|5,NA|6||8|9"]
    _, kept = _head(logs, rows)
    assert [(r["history"], r["times"], r["actions"]) for r in kept] == [
        (["11", "33", "44"], [100, 300, 400], [1, 3, 4]),
        (["22", "44", "55"], [2, 4, 5], [6, 8, 9]),
    ]


def test_a_side_value_missing_beside_an_item_or_bad_beside_a_missing_one_is_a_malformed_row(
    logs: Path,
):
    # The item 22 has no time: no time of another item takes its place (before, the row was
    # kept as 11, 22, 33 at 100, 200, 300: 22 paired with the NA item's time and action). The
    # time dropped with an NA item is read all the same: 'abc' is no time beside a missing item
    # as beside a present one (before, line 3 was kept as 11, 33 at 100, 300).
    rows = ["1,7,11|NA|22|33,100|200||300,1|2||4", "1,7,11|NA|33,100|abc|300,1|2|3"]
    result, kept = _head(logs, rows)
    assert result["rows_skipped"] == {"side_length": 1, "bad_integer": 1}
    assert result["first_errors"][0].endswith("train.csv:2: times: '100|200||300' (side_length)")
    assert result["first_errors"][1].endswith("train.csv:3: times: '100|abc|300' (bad_integer)")
    assert kept == []
