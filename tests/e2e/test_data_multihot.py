"""`shardrec data multihot`: the materialised ids are the MLPerf reference's, the dataset is a
valid shardrec dataset the loader reads, reruns give the same bytes, bad input is one line."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import write_tiny_dataset
from dataset_writing import change_part_byte, file_offset
from helpers import assert_one_line_error
from multihot_reference import reference_multihot, reference_tables
from typer.testing import CliRunner

from shardrec.dataloader.format.integrity import verify
from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.format.part_file import open_split
from shardrec.tools.cli.app import app

runner = CliRunner()
CARDS = (50, 300, 7, 1000)


@pytest.fixture
def one_hot(tmp_path: Path) -> Path:
    write_tiny_dataset(
        tmp_path / "src", rows={"train": [300, 200], "val": [128]}, cardinalities=CARDS
    )
    return tmp_path / "src"


def _multihot(src: Path, out: Path, *args: str):
    return runner.invoke(
        app,
        [
            "data",
            "multihot",
            str(src),
            "--out",
            str(out),
            "--cache",
            str(src.parent / "cache"),
            *args,
        ],
    )


@pytest.mark.parametrize("dist", ["uniform", "pareto"])
@pytest.mark.parametrize("rows", [None, [40, 300, 3, 17]])
def test_materialised_ids_are_the_reference_ids(
    one_hot: Path, tmp_path: Path, dist: str, rows: list[int] | None
):
    sizes = [3, 1, 2, 6]
    extra = ["--rows", ",".join(map(str, rows))] if rows else []
    result = _multihot(
        one_hot, tmp_path / "mh", "--sizes", "3,1,2,6", "--dist", dist, "--json", *extra
    )
    assert result.exit_code == 0, result.output
    table_rows = rows or list(CARDS)
    table_rows = rows or list(CARDS)
    spec = {"sizes": sizes, "rows": table_rows, "dist": dist, "seed": 0, "source": str(one_hot)}
    shown = json.loads(result.stdout)
    assert shown.pop("seconds") >= 0
    assert shown.pop("criteo_1tb_hours") == pytest.approx(
        4_373_472_329 / shown.pop("rows_per_s") / 3600, rel=0.01
    )
    written = sum(p.stat().st_size for p in (tmp_path / "mh").rglob("part-*.arrow"))
    assert shown.pop("bytes_written") == written and shown.pop("mb_per_s_written") >= 0
    assert (
        shown.pop("cpu_seconds") > 0
        and shown.pop("rows_per_cpu_s") > 0
        and shown.pop("setup_seconds") >= 0
    )
    assert shown.pop("cpu_wait_seconds") >= 0
    assert shown.pop("cores") == len(os.sched_getaffinity(0))
    assert [len(v) for v in shown.pop("load_average").values()] == [3, 3]
    assert shown == {"out": str(tmp_path / "mh"), "samples": 628, "workers": 1, "multihot": spec}
    tables = reference_tables(sizes, table_rows, dist)
    src, out = Manifest.load(one_hot), Manifest.load(tmp_path / "mh")
    assert [(f.name, f.cardinality, f.multi_hot) for f in out.sparse_features] == [
        (f"f{t}", table_rows[t], sizes[t] > 1) for t in range(4)
    ]
    assert out.options["multihot"] == spec
    assert [f.stats["mean_ids_per_sample"] for f in out.sparse_features] == sizes
    for split in ("train", "val"):
        for a, b in zip(open_split(one_hot, split, src), open_split(tmp_path / "mh", split, out)):
            assert np.array_equal(a.labels, b.labels) and np.array_equal(a.dense, b.dense)
            for t, name in enumerate(src.feature_names):
                want = reference_multihot(a.sparse[name], tables[t])
                np.testing.assert_array_equal(
                    np.asarray(b.sparse[name], np.int64), want.reshape(-1)
                )
                if sizes[t] > 1:
                    np.testing.assert_array_equal(b.offsets[name], np.arange(a.rows + 1) * sizes[t])
    assert verify(tmp_path / "mh") == []


def test_rerun_on_more_workers_writes_the_same_bytes_and_reuses_the_tables(
    one_hot: Path, tmp_path: Path, monkeypatch
):
    import shardrec.tools.cli.data.multihot as command

    beside: list[list[str]] = []  # what lies beside OUT as each run starts
    real = command.materialize_multihot

    def materialize(src, out, *args, **kwargs):
        beside.append(sorted(p.name for p in Path(out).parent.iterdir()))
        return real(src, out, *args, **kwargs)

    monkeypatch.setattr(command, "materialize_multihot", materialize)
    first = _multihot(
        one_hot, tmp_path / "a", "--sizes", "2,4,1,3", "--dist", "pareto", "--seed", "7"
    )
    assert first.exit_code == 0, first.output
    tables = list((one_hot.parent / "cache").rglob("table-*.npy"))
    stamps = {p: p.stat().st_mtime_ns for p in tables}
    assert len(tables) == 4
    second = _multihot(
        one_hot, tmp_path / "b", "--sizes", "2,4,1,3", "--dist", "pareto", "--seed", "7", "--workers", "3",
        "--compare-workers",
    )  # fmt: skip
    assert second.exit_code == 0, second.output
    # The one-worker run and its ratio, in the same command; its scratch copy is gone.
    assert re.search(r"^3 workers: \d+\.\d\dx one worker \([\d,]+ rows/s, Criteo 1TB [\d,.]+ h\), same bytes$",
                     second.stdout, re.M), second.stdout  # fmt: skip
    assert re.search(
        r"^rows per CPU-second: [\d,]+ on one worker, [\d,]+ on 3$", second.stdout, re.M
    ), second.stdout
    assert re.search(r"^\d+ cores, load average \(1, 5, 15 min\)", second.stdout, re.M), (
        second.stdout
    )
    # The one-worker copy is deleted before the second run starts: one copy on disk at a time.
    assert beside[1:] == [["a", "cache", "src"], ["a", "cache", "src"]], beside
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "cache", "src"]
    assert {p: p.stat().st_mtime_ns for p in tables} == stamps  # drawn once
    a, b = Manifest.load(tmp_path / "a"), Manifest.load(tmp_path / "b")
    assert a.splits == b.splits and a.sparse_features == b.sparse_features
    other = _multihot(
        one_hot, tmp_path / "c", "--sizes", "2,4,1,3", "--dist", "pareto", "--seed", "8"
    )
    assert other.exit_code == 0 and Manifest.load(tmp_path / "c").splits != a.splits


def test_head_json_shows_multi_hot_ids_as_lists(one_hot: Path, tmp_path: Path):
    assert _multihot(one_hot, tmp_path / "mh", "--sizes", "3,1,2,6").exit_code == 0
    result = runner.invoke(app, ["data", "head", str(tmp_path / "mh"), "-n", "2", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    first = open_split(one_hot, "train")[0]
    tables = reference_tables([3, 1, 2, 6], list(CARDS), "uniform")
    for r, row in enumerate(rows):
        assert row["f0"] == tables[0][int(first.sparse["f0"][r])].tolist() and len(row["f3"]) == 6
        assert row["f1"] == int(first.sparse["f1"][r])  # size 1: still one id, not a list


def test_the_materialised_dataset_loads_into_batches(one_hot: Path, tmp_path: Path):
    from conftest import loader_kwargs

    from shardrec.dataloader.loader import build_loader

    assert _multihot(one_hot, tmp_path / "mh", "--sizes", "3,1,2,6").exit_code == 0
    loader = build_loader(
        tmp_path / "mh",
        "train",
        global_batch_size=64,
        rank=0,
        world_size=1,
        **loader_kwargs(seed=1),
    )
    batches = list(loader)
    assert len(batches) == 500 // 64
    kjt = batches[0].sparse_features.to_dict()
    assert [int(kjt[f].lengths().unique()[0]) for f in ("f0", "f1", "f2", "f3")] == [3, 1, 2, 6]
    assert kjt["f3"].values().dtype.is_floating_point is False and len(kjt["f3"].values()) == 64 * 6


def test_bad_input_is_one_clear_line(one_hot: Path, tmp_path: Path):
    assert_one_line_error(
        _multihot(one_hot, tmp_path / "o", "--sizes", "3,1,2"),
        r"^error: --sizes 3,1,2: 3 values for 4 sparse features \(f0, f1, f2, f3\): give one per "
        r"feature, in this order$",
    )
    assert_one_line_error(
        _multihot(one_hot, tmp_path / "o", "--sizes", "3,x,2,1"),
        r"--sizes '3,x,2,1': expected comma-separated integers",
    )
    assert_one_line_error(
        _multihot(one_hot, tmp_path / "o", "--sizes", "3,0,2,1"),
        r"^error: --sizes 3,0,2,1: 0 for f1 must be at least 1$",
    )
    assert_one_line_error(
        _multihot(one_hot, tmp_path / "o", "--sizes", "3,1,2,1", "--dist", "zipf"),
        r"--dist 'zipf' must be one of uniform, pareto",
    )
    assert_one_line_error(
        _multihot(one_hot, tmp_path / "o", "--sizes", "3,1,2,1", "--rows", "4,5"),
        r"^error: --rows 4,5: 2 values for 4 sparse features",
    )
    assert_one_line_error(
        _multihot(one_hot, tmp_path / "o", "--sizes", "3,1,2,1", "--rows", "4,5,0,6"),
        r"^error: --rows 4,5,0,6: 0 for f2 must be in \[1, 2\^31\)$",
    )
    assert_one_line_error(
        _multihot(tmp_path / "nope", tmp_path / "o", "--sizes", "1"), r"nope: does not exist"
    )
    assert_one_line_error(
        _multihot(one_hot, tmp_path / "o", "--sizes", "3,1,2,1", "--compare-workers"),
        r"--compare-workers needs --workers of at least 2 to compare with one worker, got 1",
    )
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    assert_one_line_error(
        _multihot(one_hot, tmp_path / "full", "--sizes", "3,1,2,1"),
        r"full: exists and is not an empty directory",
    )
    assert (tmp_path / "full" / "x").read_text() == "keep me"
    assert_one_line_error(
        _multihot(one_hot, one_hot / "inner", "--sizes", "3,1,2,1"), r"inside the source dataset"
    )
    assert _multihot(one_hot, tmp_path / "mh", "--sizes", "3,1,2,1").exit_code == 0
    assert_one_line_error(
        _multihot(tmp_path / "mh", tmp_path / "again", "--sizes", "3,1,2,1"),
        f"^error: {tmp_path / 'mh'}: feature f0 is already multi-hot \\(a `shardrec data multihot` "
        f"copy of {one_hot}\\): multi-hot ids are made from one-hot ones; give `data multihot` the "
        "one-hot dataset it was copied from$",
    )
    assert not list(tmp_path.glob(".o.tmp-*")) and not (tmp_path / "o").exists()


def test_an_out_that_cannot_be_made_is_one_line_and_nothing_is_written(
    one_hot: Path, tmp_path: Path
):
    """--out under a file (or where no folder can be made): was NotADirectoryError's traceback."""
    (tmp_path / "afile").write_text("keep me")
    out = tmp_path / "afile" / "mh"
    assert_one_line_error(
        _multihot(one_hot, out, "--sizes", "3,1,2,1"),
        f"^error: {re.escape(str(out))}: cannot write the multi-hot copy \\(Not a directory\\); "
        "nothing written$",
    )
    assert (tmp_path / "afile").read_text() == "keep me"


def test_raw_ids_are_refused_in_one_line_with_or_without_rows(tmp_path: Path):
    """A raw-id feature (--raw-ids) has 64-bit keys, not table rows: there is nothing to expand.
    Without --rows it said "table rows 0 of feature 3", with them "one-hot id ... outside its
    0 rows (corrupted source?)"."""
    write_tiny_dataset(tmp_path / "raw", rows={"train": [64]}, raw=("f3",))
    for rows in ((), ("--rows", "50,300,7,1000")):
        assert_one_line_error(
            _multihot(tmp_path / "raw", tmp_path / "o", "--sizes", "2,2,2,2", *rows),
            r"^error: feature f3 holds raw ids \(preprocessed with --raw-ids\), not table rows: "
            r"multi-hot ids are made from one-hot rows; preprocess it without --raw-ids$",
        )
    assert not (tmp_path / "o").exists()


def test_a_corrupted_source_part_is_named_and_nothing_is_written(one_hot: Path, tmp_path: Path):
    dense = open_split(one_hot, "train")[1].dense
    at = file_offset(dense) + dense.nbytes - 1  # the last dense value: its metadata is intact
    change_part_byte(one_hot, "train", 1, at, record=False)
    line = assert_one_line_error(
        _multihot(one_hot, tmp_path / "mh", "--sizes", "3,1,2,1"),
        r"checksum differs from its manifest",
    )
    assert "train/part-00001.arrow" in line
    assert not (tmp_path / "mh").exists() and not list(tmp_path.glob(".mh.tmp-*"))


def test_a_rerun_removes_the_copy_a_killed_run_left_beside_out(one_hot: Path, tmp_path: Path):
    """A run killed before its rename (SIGKILL, the OOM killer) leaves its temporary folder,
    up to a whole copy, under a dot-name with its pid: the rerun removes it, not a live run's."""
    import subprocess
    import sys

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid no process has now
    killed = tmp_path / f".mh.tmp-{gone.pid}"
    (killed / "train").mkdir(parents=True)
    (killed / "train" / "part-00000.arrow").write_bytes(b"x" * 4096)
    running = tmp_path / f".mh.tmp-{os.getppid()}"  # a live process's: kept
    running.mkdir()
    result = _multihot(one_hot, tmp_path / "mh", "--sizes", "3,1,2,1")
    assert result.exit_code == 0, result.output
    assert not killed.exists() and running.exists()
    assert verify(tmp_path / "mh") == []


def test_files_reach_the_disk_before_the_manifest_while_the_workers_go_on(
    one_hot: Path, tmp_path: Path, monkeypatch
):
    synced: dict[str, str] = {}  # file -> the thread that synced it
    real_fsync, real_save = os.fsync, Manifest.save

    def fsync(fd: int) -> None:
        synced.setdefault(os.readlink(f"/proc/self/fd/{fd}"), threading.current_thread().name)
        real_fsync(fd)

    def save(manifest: Manifest, directory: Path) -> None:
        files = list(Path(directory).rglob("*.arrow"))
        assert files and all(str(p) in synced for p in files), (
            "the manifest was written before every file was synced"
        )
        real_save(manifest, directory)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Manifest, "save", save)
    result = _multihot(one_hot, tmp_path / "mh", "--sizes", "2,4,1,3", "--workers", "2")
    assert result.exit_code == 0, result.output
    # Workers (shardrec-multihot_N) convert the next parts while the written ones are synced.
    threads = {thread for name, thread in synced.items() if name.endswith(".arrow")}
    assert threads and not any(t.startswith("shardrec-multihot_") for t in threads), threads
    assert verify(tmp_path / "mh") == []


def test_ctrl_c_ends_in_one_line_and_leaves_no_output(
    one_hot: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Ctrl-C mid-conversion: exit 130 and the `interrupted:` line, not the run's summary."""
    import shardrec.tools.cli.data.multihot as command

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "materialize_multihot", interrupt)
    result = _multihot(one_hot, tmp_path / "mh", "--sizes", "3,1,2,6")
    assert result.exit_code == 130
    assert result.output.splitlines()[-1:] == [  # after the progress bar as it stood
        f"interrupted: {tmp_path / 'mh'}: nothing written (parts are converted in a temporary "
        "folder, now removed); the index tables drawn are kept; rerun the same command"
    ]
    assert "wrote" not in result.output and not (tmp_path / "mh").exists()


def test_a_plan_with_on_the_fly_multi_hot_prices_each_table_at_its_size(
    one_hot: Path, tmp_path: Path
):
    # Before, the planner read the stored one-hot features' pooling (1) and planned the tables of
    # an on-the-fly multi-hot job (DLRMv2's default) as one-hot: about half the lookups it makes.
    plan = tmp_path / "plan.json"
    args = ["plan", "--data", str(one_hot), "--world-size", "2", "--topology", "cpu-gloo"]
    sets = ["--set", "data.multihot_sizes=[3,1,2,6]"]
    result = runner.invoke(app, [*args, *sets, "--out", str(plan)])
    assert result.exit_code == 0, result.output
    estimate = json.loads(plan.read_text())["estimate"]
    assert estimate["ids_per_sample"] == {"t_f0": 3.0, "t_f2": 2.0, "t_f3": 6.0}


def test_verify_of_a_damaged_copy_says_to_write_it_again_into_a_new_folder(
    one_hot: Path, tmp_path: Path
):
    """verify said to re-run the command that made the copy into it, naming `shardrec preprocess`;
    `data multihot` into it is refused ('exists and is not an empty directory')."""
    out = tmp_path / "mh"
    assert _multihot(one_hot, out, "--sizes", "3,1,2,6").exit_code == 0
    part = sorted((out / "train").glob("*.arrow"))[0]
    part.write_bytes(part.read_bytes()[:-8])
    verify = runner.invoke(app, ["data", "verify", str(out)], env={"COLUMNS": "300"})
    assert verify.exit_code == 1
    assert verify.stdout.splitlines()[-1] == (
        f"to repair {out}, write it again into a new folder: `shardrec data multihot {one_hot} "
        "--out NEW` with the settings its manifest's options.multihot records"
    )
