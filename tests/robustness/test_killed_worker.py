"""A preprocessing worker killed mid-task, as the OOM killer does (README, Failures and trust:
Preprocessing): the run ends within seconds naming the task, finished tasks are kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import assert_one_line_error
from process_table import processes

from shardrec.tools.synth.criteo import write_dataset

ARGS = ["--max-ids", "5000", "--chunk-mb", "0.1", "--workers", "2"]


def _workers(parent: int) -> list[int]:
    """Pids of the pool's worker processes: children of `parent` started by multiprocessing
    spawn."""
    return [
        p.pid
        for p in processes()
        if p.ppid == parent and any(b"spawn_main" in arg for arg in p.argv)
    ]


def _preprocess(raw: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "shardrec.tools.cli",
        "preprocess",
        str(raw),
        "--out",
        str(out),
        *ARGS,
    ]


def _finished(out: Path) -> int:
    # A streamed .gz range's task is finished once staged (its split waits for the line count).
    return len(list((out / ".work").glob("task-*.json"))) + len(
        list((out / ".work").glob("staged-*.json"))
    )


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds worker pids in /proc")
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip-streamed"])
def test_sigkilled_worker_ends_the_run_naming_the_task_and_the_rerun_finishes(
    tmp_path: Path, gz: bool
):
    # ~25 MB of text, ~240 tasks; the .gz is one file decoded once, its ranges parsed by the
    # workers. The worker is killed once a first task is done: the run must still be far from its
    # end then, even with the suite's other processes slowing this one (at 40,000 rows a kill once
    # landed after the last task, and the run rightly finished).
    raw = write_dataset(tmp_path / "raw", rows=100_000, seed=5, max_vocab=3000, gz=gz)[0]
    out = tmp_path / "data"
    proc = subprocess.Popen(
        _preprocess(raw, out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline, victim = time.time() + 60, None
    while time.time() < deadline and victim is None and proc.poll() is None:
        pids = _workers(proc.pid)
        if pids and (out / ".work").is_dir() and _finished(out):  # workers are past start-up
            victim = pids[0]
        time.sleep(0.005)
    assert victim is not None, "no worker seen mid-run; make the input larger"
    os.kill(victim, signal.SIGKILL)
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("shardrec preprocess hung after a worker was killed")
    done = subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)
    assert_one_line_error(
        done,
        r"^error: a worker process died .* while running task \d+ \(.*train\.txt(\.gz)? bytes \d+-\d+\).*rerun",
    )
    assert not (out / "manifest.json").exists()
    kept = _finished(out)

    rerun = subprocess.run(
        _preprocess(raw, out) + ["--json"], capture_output=True, text=True, timeout=300
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    clean = tmp_path / "clean"
    subprocess.run(_preprocess(raw, clean), capture_output=True, check=True, timeout=300)
    tree = lambda d: {
        str(p.relative_to(d)): p.read_bytes()
        for p in sorted(d.rglob("*"))
        if p.is_file() and ".work" not in p.parts
    }  # noqa: E731
    assert tree(out) == tree(clean)  # nothing written before the kill was lost or corrupt
    assert f'"tasks_run": {len(list((out / ".work").glob("task-*.json"))) - kept}' in rerun.stdout
    assert not list(out.rglob(".*.tmp*"))
