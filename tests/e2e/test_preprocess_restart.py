"""Determinism of `shardrec preprocess`: worker count, SIGKILL and rerun, --part i/n and merge."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import assert_one_line_error
from process_table import kill_session, session_processes
from typer.testing import CliRunner

from shardrec.tools.cli.app import app
from shardrec.tools.synth.criteo import write_dataset

runner = CliRunner()
ARGS = ["--max-ids", "5000", "--chunk-mb", "0.25"]


def cli(*args) -> dict:
    result = runner.invoke(app, [str(a) for a in args] + ["--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def tree_bytes(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def outputs(directory: Path) -> dict[str, bytes]:
    """What a user gets: the manifest and every part file (not the .work bookkeeping)."""
    return {k: v for k, v in tree_bytes(directory).items() if not k.startswith(".work")}


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    # ~2.4 MB: about 10 tasks of 0.25 MiB.
    return write_dataset(tmp_path_factory.mktemp("raw"), rows=10_000, seed=11, max_vocab=3000)[0]


@pytest.fixture(scope="module")
def reference(raw: Path, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("ref") / "data"
    res = cli("preprocess", raw, "--out", out, *ARGS)
    assert res["tasks_total"] >= 8
    return outputs(out)


@pytest.mark.slow
def test_output_is_byte_identical_whatever_the_worker_count(raw: Path, reference, tmp_path: Path):
    cli("preprocess", raw, "--out", tmp_path / "w2", *ARGS, "--workers", "2")
    assert outputs(tmp_path / "w2") == reference


@pytest.mark.slow
def test_sigkill_then_rerun_redoes_only_unfinished_tasks(raw: Path, reference, tmp_path: Path):
    out = tmp_path / "data"
    cmd = [
        sys.executable,
        "-m",
        "shardrec.tools.cli",
        "preprocess",
        str(raw),
        "--out",
        str(out),
        *ARGS,
        "--chunk-mb",
        "0.1",
    ]
    # Smaller tasks so the kill lands mid-run: different chunking is a different run, so the
    # comparison below is against an uninterrupted run with the same arguments.
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    markers = out / ".work"
    deadline = time.time() + 60
    while time.time() < deadline and len(list(markers.glob("task-*.json"))) < 3:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = len(list(markers.glob("task-*.json")))
    assert not (out / "manifest.json").exists(), (
        "the run finished before the kill; make the input larger"
    )
    res = cli("preprocess", raw, "--out", out, *ARGS, "--chunk-mb", "0.1")
    assert res["complete"] and res["tasks_run"] == res["tasks_total"] - done_before
    clean = tmp_path / "clean"
    cli("preprocess", raw, "--out", clean, *ARGS, "--chunk-mb", "0.1")
    assert outputs(out) == outputs(clean)
    assert not [p for p in out.rglob(".*.tmp*")]


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["ctrl-c", "kill"])
def test_ctrl_c_or_a_kill_says_what_is_kept_and_the_rerun_finishes(
    raw: Path, tmp_path: Path, stop: str
):
    """Ctrl-C (SIGINT to the foreground process group) or a kill (SIGTERM to the command alone, as
    a script stops its `cmd &`) mid-run: exit 130 or 143 with one line saying the finished tasks
    are kept, no worker left running, and the same command then finishes the same bytes."""
    out = tmp_path / "data"
    args = [str(raw), "--out", str(out), *ARGS, "--chunk-mb", "0.1"]
    cmd = [sys.executable, "-m", "shardrec.tools.cli", "preprocess", *args]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    markers = out / ".work"
    deadline = time.time() + 60
    while time.time() < deadline and len(list(markers.glob("task-*.json"))) < 3:
        time.sleep(0.01)
    try:
        if stop == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        time.sleep(0.2)  # what the command ended last has had time to go
        left = [p.command for p in session_processes(proc.pid)]
    finally:
        kill_session(proc.pid)
    assert not (out / "manifest.json").exists(), "the run finished first; make the input larger"
    assert proc.returncode == (130 if stop == "ctrl-c" else 143), err
    assert err.strip().splitlines()[-1] == (
        f"interrupted: {out}: finished tasks are kept; rerun the same command to finish"
    )
    assert left == [], "its workers survive the stop"
    assert cli("preprocess", *args)["complete"]
    clean = tmp_path / "clean"
    cli("preprocess", raw, "--out", clean, *ARGS, "--chunk-mb", "0.1")
    assert outputs(out) == outputs(clean)


@pytest.mark.slow
def test_ctrl_c_while_the_workers_start_ends_in_one_line_without_a_traceback(
    raw: Path, tmp_path: Path
):
    """Ctrl-C as the workers are spawned and import their modules (a run's first second). Before,
    each worker printed a KeyboardInterrupt traceback and died, and the run could wait forever (its
    pool broke while it cancelled its futures)."""
    out = tmp_path / "data"
    args = [str(raw), "--out", str(out), *ARGS, "--workers", "2"]
    cmd = [sys.executable, "-m", "shardrec.tools.cli", "preprocess", *args]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.time() + 60
    while (
        time.time() < deadline
        and sum("spawn_main" in p.command for p in session_processes(proc.pid)) < 2
    ):  # both workers started (not the resource tracker); now they import numba and ours
        time.sleep(0.005)
    time.sleep(0.1)
    try:
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        time.sleep(0.2)
        left = [p.command for p in session_processes(proc.pid)]
    finally:
        kill_session(proc.pid)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines() == [
        f"interrupted: {out}: finished tasks are kept; rerun the same command to finish"
    ]
    assert left == [], "its workers survive the stop"


def test_rerun_after_lost_task_redoes_only_that_task(raw: Path, reference, tmp_path: Path):
    out = tmp_path / "data"
    cli("preprocess", raw, "--out", out, *ARGS)
    # What a kill mid-task leaves: no marker for the task, a half-written temporary file.
    (out / ".work" / "task-00003.json").unlink()
    (out / "manifest.json").unlink()
    (out / "train" / ".part-00003-0000.arrow.tmp-999").write_bytes(b"partial")
    res = cli("preprocess", raw, "--out", out, *ARGS)
    assert res["tasks_run"] == 1
    assert outputs(out) == reference


def test_parts_then_merge_equal_one_machine(raw: Path, reference, tmp_path: Path):
    out = tmp_path / "data"
    first = cli("preprocess", raw, "--out", out, *ARGS, "--part", "0/3")
    assert not first["complete"] and first["tasks_run"] == (first["tasks_total"] + 2) // 3
    cli("preprocess", raw, "--out", out, *ARGS, "--part", "2/3")
    cli("preprocess", raw, "--out", out, *ARGS, "--part", "1/3")
    final = cli("preprocess", raw, "--out", out, *ARGS)
    assert final["complete"] and final["tasks_run"] == 0
    assert outputs(out) == reference


def test_vocabulary_mode_parts_count_then_map(raw: Path, tmp_path: Path):
    vocab = ["--min-count", "3", "--chunk-mb", "0.25"]
    cli("preprocess", raw, "--out", tmp_path / "one", *vocab)
    out = tmp_path / "parts"
    counted = cli("preprocess", raw, "--out", out, *vocab, "--part", "0/2")
    assert counted["tasks_run"] == 0 and not counted["complete"]  # part 1 has not counted yet
    cli(
        "preprocess", raw, "--out", out, *vocab, "--part", "1/2"
    )  # counts, builds the vocabulary, maps
    cli("preprocess", raw, "--out", out, *vocab, "--part", "0/2")  # maps
    assert cli("preprocess", raw, "--out", out, *vocab)["tasks_run"] == 0
    assert outputs(out) == outputs(tmp_path / "one")


def test_output_is_the_same_without_the_compiled_kernels(
    raw: Path, reference, tmp_path: Path, monkeypatch
):
    from shardrec.tools.preprocess.parse import parse_kernel

    monkeypatch.setattr(parse_kernel, "AVAILABLE", False)  # what a machine without numba runs
    cli("preprocess", raw, "--out", tmp_path / "numpy", *ARGS)
    assert outputs(tmp_path / "numpy") == reference


def test_output_is_the_same_when_part_columns_must_grow(
    raw: Path, reference, tmp_path: Path, monkeypatch
):
    from shardrec.tools.preprocess.tasks import task_run as preprocess_task

    # A row estimate that always falls short: every piece grows the part's columns.
    monkeypatch.setattr(preprocess_task, "_capacity", lambda *args: 1)
    cli("preprocess", raw, "--out", tmp_path / "grown", *ARGS)
    assert outputs(tmp_path / "grown") == reference


def test_failed_background_fsync_fails_the_run_without_marking_the_task(
    raw: Path, tmp_path: Path, monkeypatch
):
    from shardrec.tools.preprocess.tasks import task_markers

    def no_space(files, marker, payload):  # what the sync thread meets on a full disk
        raise OSError(28, "No space left on device", str(files[0]))

    monkeypatch.setattr(task_markers, "_sync_then_mark", no_space)
    out = tmp_path / "data"
    result = runner.invoke(app, ["preprocess", str(raw), "--out", str(out), *ARGS])
    assert_one_line_error(result, re.escape("No space left on device"))
    assert list((out / "train").glob("part-*.arrow"))  # parts were written, then their sync failed
    assert not list((out / ".work").glob("task-*.json"))  # so no task is recorded as finished
    monkeypatch.undo()
    assert cli("preprocess", raw, "--out", out, *ARGS)["complete"]


def test_output_does_not_depend_on_the_parse_piece_size(tmp_path: Path, monkeypatch):
    from shardrec.tools.preprocess.tasks import task_run as preprocess_task

    lines = (
        write_dataset(tmp_path / "raw", rows=3000, seed=12, max_vocab=500)[0]
        .read_bytes()
        .split(b"\n")
    )
    # Malformed rows met in reverse REASONS order, far apart: with small parse pieces each
    # reason is first seen in a different piece.
    for at, bad in (
        (2500, b"0" + b"\t" * 40),
        (1500, b"x" + b"\t" * 39),
        (500, b"1" + b"\t1" * 13 + b"\tzz" + b"\tab" * 25),
    ):
        lines.insert(at, bad)
    text = tmp_path / "bad.tsv"
    text.write_bytes(b"\n".join(lines))
    one_task = ["--max-ids", "5000"]  # one task, one read piece: only the parse pieces differ
    cli("preprocess", text, "--out", tmp_path / "whole", *one_task)
    monkeypatch.setattr(preprocess_task, "PARSE_BYTES", 4096)
    res = cli("preprocess", text, "--out", tmp_path / "small", *one_task)
    assert set(res["rows_skipped"]) == {"too_many_fields", "bad_label", "bad_hex"}
    assert outputs(tmp_path / "small") == outputs(tmp_path / "whole")


@pytest.mark.parametrize("damage", ["cut", "changed-byte"])
def test_verify_says_how_to_repair_a_damaged_part_and_following_it_does(tmp_path: Path, damage):
    """verify named the damaged part and said to rerun the same preprocess into the dataset; for a
    changed byte (the part's size kept) that rerun said 'nothing to do: all 5 task(s) were already
    done' and left the part as it was, so verify kept failing. It now says to remove the files it
    names first, which the rerun writes again."""
    raw = write_dataset(tmp_path / "raw", rows=1500, seed=2, max_vocab=300)[0]
    out = tmp_path / "data"
    cli("preprocess", raw, "--out", out, *ARGS)
    before = outputs(out)
    part = sorted((out / "train").glob("*.arrow"))[0]
    data, size = bytearray(part.read_bytes()), part.stat().st_size
    if damage == "cut":
        part.write_bytes(data[: size // 2])
        problem = f"{part}: {size // 2} bytes, manifest says {size}"
    else:
        data[size // 2] ^= 0x40
        part.write_bytes(bytes(data))
        problem = f"{part}: checksum differs from the manifest"
    verify = runner.invoke(app, ["data", "verify", str(out)], env={"COLUMNS": "300"})
    assert verify.exit_code == 1
    assert verify.stdout.splitlines() == [
        f"problem: {problem}",
        f"to repair {out}, remove the files named above, then re-run the `shardrec preprocess` "
        "that made it, into it, with the same inputs and options: it writes them again",
    ]
    # --json says what the text says (before, the repair line was missing from it)
    shown = json.loads(runner.invoke(app, ["data", "verify", str(out), "--json"]).stdout)
    assert shown["problems"] == [verify.stdout.splitlines()[0].removeprefix("problem: ")]
    assert shown["repair"] == verify.stdout.splitlines()[1]
    part.unlink()
    cli("preprocess", raw, "--out", out, *ARGS)
    assert runner.invoke(app, ["data", "verify", str(out)]).exit_code == 0
    assert outputs(out) == before
