"""A list column keeps the first max_length values of each row: `shardrec preprocess` counts the
kept rows whose list held more and the values so left out, says so in one line per column (and in
--json, the manifest and `data stats`), the same at any worker count and on a rerun, and keeps the
same values as ever; a dataset with no list cut has the manifest it always had. `predict` on raw
rows, whose lists are cut the same way, says so too."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from helpers import cli
from test_spec_flow import write_untrained_model

from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.format.part_file import open_split
from shardrec.tools.preprocess.ids.id_maps import hash_bytes, hash_ids

ROWS = 40
GENRES = ["Comedy", "Drama", "Action", "Crime", "Horror", "War"]
SPEC = """[format]
kind = "{kind}"
{header}
[[columns]]
name = "click"
role = "label"

[[columns]]
name = "genres"
role = "list"
kind = "string"
hash_size = 1000
max_length = 3
{tags}"""
TAGS = """
[[columns]]
name = "tags"
role = "list"
kind = "integer"
hash_size = 1000
max_length = 2
"""


def _genres(i: int) -> list[str]:
    """Even rows hold all 6 genres (3 left out), odd rows 2 (none)."""
    return GENRES if i % 2 == 0 else GENRES[:2]


def _report(out: Path, log: Path, spec: Path, *args: str) -> tuple[str, dict]:
    text = cli("preprocess", log, "--spec", spec, "--out", out, *args).output
    again = cli("preprocess", log, "--spec", spec, "--out", out, *args, "--json").output
    return text, json.loads(again)


def _kept_genres(out: Path) -> list[list[int]]:
    rows = []
    for split in ("train", "val", "test"):
        for part in open_split(out, split):
            ids, offsets = part.sparse["genres"], part.offsets["genres"]
            rows += [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]
    return rows


def _ids(values: list[str]) -> list[int]:
    hashed = np.array([hash_bytes(v.encode()) for v in values], np.uint64)
    return hash_ids(hashed, np.zeros(len(values), bool), 1000).tolist()


def test_csv_list_cut_is_counted_and_said(tmp_path):
    log, spec = tmp_path / "log.csv", tmp_path / "spec.toml"
    log.write_text(
        "click,genres\n" + "".join(f"{i % 2},{'|'.join(_genres(i))}\n" for i in range(ROWS))
    )
    spec.write_text(SPEC.format(kind="csv", header="header = true", tags=""))
    text, summary = _report(tmp_path / "d", log, spec)
    line = (
        "genres: 20 rows (50%) had more than max_length = 3 values; 60 values left out (raise "
        "max_length in the spec to keep them)"
    )
    assert line in text.splitlines()
    cut = {"genres": {"max_length": 3, "rows": 20, "values": 60}}
    assert summary["lists_cut"] == cut
    assert Manifest.load(tmp_path / "d").lists_cut == cut
    assert json.loads(cli("data", "stats", tmp_path / "d", "--json").output)["lists_cut"] == cut
    # the table's columns say what they count (before: "rows" and "values", as if of the list)
    table = cli("data", "stats", tmp_path / "d").output
    assert "rows cut" in table and "values left out" in table
    kept = sorted(map(tuple, _kept_genres(tmp_path / "d")))  # the first 3, as ever
    assert kept == sorted(tuple(_ids(_genres(i)[:3])) for i in range(ROWS))


def test_parquet_list_cut_counted_per_task_and_on_a_rerun(tmp_path):
    rows = np.arange(ROWS)
    tags = [[int(i), None, 7, 8, 9] if i % 4 == 0 else [int(i)] for i in rows]  # a null: no value
    table = pa.table(
        {
            "click": pa.array(rows % 2, pa.int64()),
            "genres": pa.array([_genres(i) for i in rows], pa.list_(pa.string())),
            "tags": pa.array(tags, pa.list_(pa.int64())),
        }
    )
    pq.write_table(table, tmp_path / "log.parquet", row_group_size=7)  # several tasks
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(kind="parquet", header="", tags=TAGS))
    want = {
        "genres": {"max_length": 3, "rows": 20, "values": 60},
        "tags": {"max_length": 2, "rows": 10, "values": 20},
    }
    for workers in ("1", "2"):
        out = tmp_path / f"d{workers}"
        text, summary = _report(out, tmp_path / "log.parquet", spec, "--workers", workers)
        assert summary["lists_cut"] == want  # the rerun: every task done, the counts kept
        assert (
            "tags: 10 rows (25%) had more than max_length = 2 values; 20 values left out (raise "
            "max_length in the spec to keep them)"
        ) in text.splitlines()
    assert _kept_genres(tmp_path / "d1") == _kept_genres(tmp_path / "d2")


def test_a_manifest_without_a_list_cut_keeps_its_bytes(tmp_path):
    log, spec = tmp_path / "log.csv", tmp_path / "spec.toml"
    log.write_text("click,genres\n" + "".join(f"{i % 2},Comedy|War\n" for i in range(ROWS)))
    spec.write_text(SPEC.format(kind="csv", header="header = true", tags=""))
    cli("preprocess", log, "--spec", spec, "--out", tmp_path / "d")
    assert "lists_cut" not in json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert "lists cut" not in cli("data", "stats", tmp_path / "d").output


def test_predict_on_raw_rows_says_their_lists_were_cut(tmp_path):
    log, spec = tmp_path / "log.csv", tmp_path / "spec.toml"
    log.write_text(
        "click,genres\n" + "".join(f"{i % 2},{'|'.join(_genres(i))}\n" for i in range(ROWS))
    )
    spec.write_text(SPEC.format(kind="csv", header="header = true", tags=""))
    cli("preprocess", log, "--spec", spec, "--out", tmp_path / "d")
    model = tmp_path / "m.safetensors"
    write_untrained_model(tmp_path / "d", model)
    result = cli("predict", model, log, "--out", tmp_path / "p.txt")
    assert (
        f"warning: {log}: genres: 20 rows (50%) had more than max_length = 3 values; 60 values "
        "left out (scored on the values preprocessing keeps, as the model was trained)"
    ) in result.stderr.splitlines()
    summary = json.loads(cli("predict", model, log, "--out", tmp_path / "j.txt", "--json").stdout)
    assert summary["lists_cut"] == {"genres": {"max_length": 3, "rows": 20, "values": 60}}
    log.write_text("click,genres\n1,Comedy|War\n0,Drama\n")  # no list cut: not a word
    result = cli("predict", model, log, "--out", tmp_path / "q.txt")
    assert "max_length" not in result.stderr
    summary = json.loads(cli("predict", model, log, "--out", tmp_path / "k.txt", "--json").stdout)
    assert "lists_cut" not in summary


SEQUENCE_SPEC = """[format]
kind = "csv"
header = true

[[columns]]
name = "click"
role = "label"

[[columns]]
name = "history"
role = "sequence"
kind = "integer"
hash_size = 1000
max_length = 50

[[columns]]
name = "times"
role = "sequence"
kind = "integer"
side_of = "history"
values = "timestamps"
"""


def test_a_side_sequence_is_cut_with_its_primary_and_said_once(tmp_path):
    # A side keeps as many values as its primary's max_length (its own default of 32 is not
    # read): before, `times` was said cut at 32, 180 values left out, though it kept all 40 of
    # the odd rows and 50 of the even ones, as `history` did.
    log, spec = tmp_path / "log.csv", tmp_path / "spec.toml"
    lines = ["click,history,times"]
    for i in range(10):
        n = 60 if i % 2 == 0 else 40  # even rows: 10 items (and times) left out
        lines.append(f"{i % 2},{'|'.join(map(str, range(n)))},{'|'.join(map(str, range(n)))}")
    log.write_text("\n".join(lines) + "\n")
    spec.write_text(SEQUENCE_SPEC)
    text = cli("preprocess", log, "--spec", spec, "--out", tmp_path / "d").output
    said = [line for line in text.splitlines() if "max_length" in line]
    assert said == [
        "history: 5 rows (50%) had more than max_length = 50 values; 50 values left out (raise "
        "max_length in the spec to keep them)"
    ]
    cut = {"history": {"max_length": 50, "rows": 5, "values": 50}}
    assert Manifest.load(tmp_path / "d").lists_cut == cut
