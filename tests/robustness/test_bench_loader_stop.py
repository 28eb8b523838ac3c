"""A stopped `shardrec bench loader` removes the data it was writing into its temporary folder and
ends in one line, as bench preprocess does (test_bench_stop.py): Ctrl-C with exit code 130, a
kill (SIGTERM) with 143."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "kill"]
)
def test_a_stopped_bench_loader_removes_its_data_in_one_line(
    sig: signal.Signals, code: int, tmp_path: Path
) -> None:
    job = subprocess.Popen(
        # Rows enough that writing them outlasts the wait for the folder and the stop.
        [sys.executable, "-m", "shardrec.tools.cli", "bench", "loader", "--rows", "1000000",
         "--rounds", "1", "--max-batches", "4"],
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # where its temporary folder goes
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not _its_folders(tmp_path):  # it writes its data
            assert job.poll() is None and time.monotonic() < deadline, "no temporary folder"
            time.sleep(0.02)
        os.killpg(job.pid, sig)  # a terminal's Ctrl-C, or a `kill` of its group
        _, stderr = job.communicate(timeout=60)
    finally:
        job.kill()
        job.wait(timeout=60)
    assert job.returncode == code, stderr[-3000:]
    assert stderr.splitlines() == ["interrupted: nothing measured"], stderr
    assert _its_folders(tmp_path) == [], "its temporary folder is left"


def _its_folders(tmp: Path) -> list[Path]:
    """The benchmark's temporary folders in `tmp` (torch keeps its compile cache there too)."""
    return list(tmp.glob("shardrec-*"))
