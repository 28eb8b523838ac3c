"""A stopped `shardrec bench scale` ends every process of the stage it was measuring, the stage's
own workers too (proctree.run_measured, as bench preprocess's stop does: test_bench_stop.py),
also where they would not end on their own, and removes its temporary folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import kill_session, session_processes


def test_a_stopped_bench_scale_ends_its_stage_and_the_stage_s_workers(tmp_path: Path) -> None:
    job = subprocess.Popen(
        [sys.executable, "-m", "shardrec.tools.cli", "bench", "scale", "--fraction", "1e-9",
         "--batch", "32", "--workers", "2", "--no-train"],
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # where its temporary folder goes
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:  # until a stage (shardrec preprocess) has started its workers
            stage = [p for p in session_processes(job.pid) if p.pid != job.pid]
            if any(p.ppid in {q.pid for q in stage} for p in stage):
                break
            assert job.poll() is None and time.monotonic() < deadline, "no stage with workers"
            time.sleep(0.02)
        # Frozen, the stage's processes can neither finish nor hear the stop: only bench scale
        # ends them. The stop is Ctrl-C's SIGINT to bench scale alone (a terminal's reaches the
        # whole group, on which the stage would end by itself).
        for p in stage:
            os.kill(p.pid, signal.SIGSTOP)
        os.kill(job.pid, signal.SIGINT)
        _, stderr = job.communicate(timeout=60)
        time.sleep(0.2)  # what bench scale signalled last has had time to go
        left = [p.command for p in session_processes(job.pid)]
        assert left == [], "its stage's processes survive the stop"
    finally:
        kill_session(job.pid)
        job.wait(timeout=60)
    assert job.returncode == 130, stderr[-3000:]
    assert list(tmp_path.iterdir()) == [], "its temporary folder is left"
