"""A stopped `shardrec bench scale` ends every process of the stage it was measuring, the stage's
own workers too (proctree.run_measured, as bench preprocess's stop does: test_bench_stop.py),
also where they would not end on their own, removes its temporary folder and says in one line
what it had measured: Ctrl-C (SIGINT) with exit code 130, a kill (SIGTERM) of bench scale alone
with 143, as bench preprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_table import Proc, kill_session, session_processes


def _start(tmp: Path, fraction: str) -> subprocess.Popen:
    """bench scale in a session of its own (a shell's job), its temporary folder in `tmp`."""
    return subprocess.Popen(
        [sys.executable, "-m", "shardrec.tools.cli", "bench", "scale", "--fraction", fraction,
         "--batch", "32", "--workers", "2", "--no-train"],
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmp)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def _workers(job: subprocess.Popen, stage: str) -> list[Proc]:
    """Once they run: the worker processes of `stage`, synth's (bench scale's own pool) or
    preprocess's (those of its child, shardrec preprocess)."""
    deadline = time.monotonic() + 60
    while True:
        procs = [p for p in session_processes(job.pid) if p.pid != job.pid]
        if stage == "synth":
            workers = [p for p in procs if p.ppid == job.pid]
        else:
            workers = [p for p in procs if p.ppid in {q.pid for q in procs}]
        if workers:
            return workers
        assert job.poll() is None and time.monotonic() < deadline, f"no {stage} workers"
        time.sleep(0.02)


@pytest.mark.parametrize(
    ("stage", "how", "code", "said"),
    [
        ("synth", "ctrl-c", 130, "nothing measured (stopped in synth)"),
        ("synth", "kill", 143, "nothing measured (stopped in synth)"),
        ("preprocess", "sigint-alone", 130, "stopped in preprocess_hash, after measuring synth"),
        ("preprocess", "kill", 143, "stopped in preprocess_hash, after measuring synth"),
    ],
    ids=["synth-ctrl-c", "synth-kill", "preprocess-sigint-alone", "preprocess-kill"],
)
def test_a_stopped_bench_scale_ends_its_stage_and_says_what_it_measured(
    stage: str, how: str, code: int, said: str, tmp_path: Path
) -> None:
    # Synth's days take long enough for its workers to be caught running.
    job = _start(tmp_path, "1e-4" if stage == "synth" else "1e-9")
    try:
        workers = _workers(job, stage)
        # Frozen, the stage's workers can neither finish their tasks nor hear the stop: the stage
        # can only end where bench scale ends it.
        for p in workers:
            os.kill(p.pid, signal.SIGSTOP)
        if how == "ctrl-c":  # a terminal's, to the whole group (synth's workers ignore it)
            os.killpg(job.pid, signal.SIGINT)
        else:  # to bench scale alone: a plain `kill`, or Ctrl-C's SIGINT (on a terminal's,
            # shardrec preprocess would end by itself)
            os.kill(job.pid, signal.SIGINT if how == "sigint-alone" else signal.SIGTERM)
        job.wait(timeout=30)  # its one line fits the pipe; a process left may hold the pipe open
        time.sleep(0.2)  # what bench scale signalled last has had time to go
        left = [p.command for p in session_processes(job.pid)]
        assert left == [], "its stage's processes survive the stop"
    finally:
        kill_session(job.pid)
        _, stderr = job.communicate(timeout=60)
    assert job.returncode == code, stderr[-3000:]
    assert stderr.splitlines() == [f"interrupted: {said}"], stderr
    assert list(tmp_path.iterdir()) == [], "its temporary folder is left"
