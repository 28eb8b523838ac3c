"""What the commands that look inside a dataset show of an event-log dataset (`shardrec
preprocess --events SPEC`): `spec show` its event spec, `data stats` and `data head` its samples
as the loader makes them."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import write_tiny_dataset
from helpers import EVENT_SPEC, assert_one_line_error, cli

from shardrec.dataloader.format.manifest import Manifest
from shardrec.tools.synth.yambda import write_yambda_like


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> tuple[Path, Path]:
    """(the event log's folder, with its spec.toml; the dataset made from it)."""
    raw = tmp_path_factory.mktemp("raw")
    write_yambda_like(raw, 3_000, seed=1)
    (raw / "spec.toml").write_text('[format]\nkind = "parquet"\n' + EVENT_SPEC)
    out = raw.parent / "ev"
    cli("preprocess", raw / "events.parquet", "--events", raw / "spec.toml", "--out", out)
    return raw, out


def test_spec_show_prints_the_event_spec_that_makes_the_same_dataset(events, tmp_path):
    """Before: `error: ev: made without shardrec preprocess (no spec recorded)`."""
    raw, out = events
    shown = cli("spec", "show", out).stdout
    assert shown.startswith(
        f"# The event spec {out} was made with (`shardrec preprocess --events {raw / 'spec.toml'}`)"
        f".\n# Its item maps' files are found from the spec file's folder ({raw}): keep this "
        "there.\n"
    ), shown
    (raw / "shown.toml").write_text(shown)  # beside the item maps, as it says
    again = tmp_path / "again"
    cli("preprocess", raw / "events.parquet", "--events", raw / "shown.toml", "--out", again)
    made, remade = Manifest.load(out).events, Manifest.load(again).events
    assert remade["spec"] == made["spec"]
    assert [p["sha256"] for p in remade["parts"]] == [p["sha256"] for p in made["parts"]]
    assert json.dumps(remade["timelines"]) == json.dumps(made["timelines"])


def test_data_heads_table_has_its_title_unpadded_and_at_most_50_rows(events, tmp_path):
    """Before: the title was centred over the table (an event-log dataset's histories make it
    thousands of columns wide), and `--rows 100000` printed a 9 MB table (rows are its columns)."""
    _, out = events
    lines = cli("data", "head", out, "--rows", "2").stdout.splitlines()
    assert lines[0] == f"{out} train: first 2 rows"
    write_tiny_dataset(tmp_path / "rows", rows={"train": [300], "val": [10], "test": [10]})
    shown = cli("data", "head", tmp_path / "rows", "--rows", "100000").stdout.splitlines()
    assert shown[0] == f"{tmp_path / 'rows'} train: first 50 rows"
    header = [line for line in shown if "field" in line][0].replace("┃", " ").split()
    assert header == ["field", *map(str, range(50))]
    assert shown[-1] == "the table shows the first 50 of the 300 rows read; --json prints them all"
    every = json.loads(cli("data", "head", tmp_path / "rows", "--rows", "100000", "--json").stdout)
    assert len(every) == 300


def test_data_stats_of_an_event_log_counts_its_windows_and_parts(events):
    """Before: `parts 0` for every split (an event log's parts are its event files, which all
    splits read), `nan` mean ids for one-hot features, and a table size for the timestamps."""
    _, out = events
    stats = json.loads(cli("data", "stats", out, "--json").stdout)
    made = Manifest.load(out).events
    for row in stats["splits"]:
        assert row["event parts"] == len(made["parts"]) > 0
        assert row["windows"] == len(made["windows"][row["split"]]) - 1 > 0
        assert "parts" not in row
    features = {f["feature"]: f for f in stats["features"]}
    assert features["cand_item"]["mean_ids_per_sample"] == 1.0
    assert features["hist_item"]["mean_ids_per_sample"] > 1
    assert features["hist_ts"]["cardinality"] is None and features["hist_item"]["cardinality"] > 0


def test_a_changed_event_file_is_refused_saying_what_to_do(events, tmp_path):
    """Before: `error: ev/events/part-00000.arrow: N bytes on disk, manifest says M (truncated or
    replaced?)`, naming the file only; verify's report says how to repair and not to run itself."""
    _, out = events
    copy = tmp_path / "ev"
    shutil.copytree(out, copy)
    part = copy / "events" / "part-00000.arrow"
    size = part.stat().st_size
    part.write_bytes(part.read_bytes() + b"x")
    assert_one_line_error(
        cli("data", "head", copy, ok=False),
        "^error: "
        + re.escape(
            f"{part}: {size + 1} bytes on disk, manifest says {size} (truncated or replaced?); "
            f"`shardrec data verify {copy}` names every changed file and how to write it again "
            "(or restore the file from a copy)"
        )
        + "$",
    )
    assert "data verify" not in cli("data", "verify", copy, ok=False).stdout
