"""A stop of `shardrec eval` (a terminal's Ctrl-C, which reaches the launcher's process group; a
SIGINT or a `kill` to the launcher alone) ends its ranks with it (torchrun's agent starts them in
sessions of their own, which no terminal signal reaches), removes its temporary folder only after
they are gone, and says so in one line: exit code 130 (143 for SIGTERM).

Before: `error: evaluation failed (torchrun exit code -9)`, exit 1, both ranks running on with
parent 1, each printing a FileNotFoundError traceback for the request file the launcher had
already removed."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
from conftest import write_tiny_dataset
from helpers import start_cli_job, wait_for_ranks
from process_table import Proc, kill_session, processes

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run-killed-at-step-6"
"""A run of 2 ranks with one checkpoint, step 4."""
RANK_MODULE = b"shardrec.trainer.inference.eval_entry"
TORCH_FOLDERS = ("torchinductor_",)
"""What torch itself leaves in the temporary directory on any run (its compile cache)."""


def _ranks(tmp: Path) -> list[Proc]:
    """The running rank processes of an eval whose TMPDIR is `tmp` (their request file is in it),
    whatever their parent is now."""
    return [
        p
        for p in processes()
        if RANK_MODULE in p.argv and p.state != "Z" and str(tmp).encode() in b" ".join(p.argv)
    ]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the ranks in /proc")
@pytest.mark.parametrize(
    ("how", "code"),
    [("ctrl-c", 130), ("sigint", 130), ("sigterm", 143)],
)
def test_a_stopped_eval_ends_its_ranks_and_removes_its_folder_in_one_line(
    tmp_path: Path, how: str, code: int
) -> None:
    run, data, tmp = tmp_path / "run", tmp_path / "data", tmp_path / "tmp"
    shutil.copytree(FIXTURE, run)
    write_tiny_dataset(data)
    tmp.mkdir()
    job = start_cli_job(
        ["eval", str(run), "--data", str(data), "--split", "val", "--device", "cpu",
         "--nproc-per-node", "2"],
        tmp,
    )  # fmt: skip
    try:
        wait_for_ranks(job, lambda: _ranks(tmp))  # both started (and still starting up)
        if how == "ctrl-c":  # a terminal's Ctrl-C, or `timeout -s INT`: the whole process group
            os.killpg(job.pid, signal.SIGINT)
        else:  # `kill -INT PID`, `kill PID`: the launcher alone
            os.kill(job.pid, signal.SIGINT if how == "sigint" else signal.SIGTERM)
        job.wait(timeout=60)
        left = _ranks(tmp)  # at once: the launcher ends after its ranks
        # The ranks share its stderr: this reads on until the last of them is gone too.
        stdout, stderr = job.communicate(timeout=60)
    finally:
        for p in _ranks(tmp):
            os.kill(p.pid, signal.SIGKILL)
        kill_session(job.pid)
    assert left == [], "its ranks run on"
    assert job.returncode == code, stderr[-3000:]
    assert stdout == ""
    assert stderr.splitlines() == ["interrupted: nothing evaluated (eval writes no files)"], stderr
    ours = [p.name for p in tmp.iterdir() if not p.name.startswith(TORCH_FOLDERS)]
    assert ours == [], "its temporary folders are left"
