"""A kill (SIGTERM) of a benchmark that trains on ranks (bench train, sequence, quality, check,
plan, plan-reality) ends it as Ctrl-C does, as bench preprocess's kill does (test_bench_stop.py):
the ranks end with it (torchrun's agent starts them in sessions of their own, which nothing else
reaches: proctree.run_to_end ends the agent's whole tree), its temporary folders are removed and
one line says so, exit code 143. bench train stands for them: they share launch_ranks and the
command's stop (options.stops_in_one_line)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from helpers import start_cli_job, wait_for_ranks
from process_table import Proc, kill_session, processes

RANK_MODULE = b"shardrec.tools.bench.train.train_bench"
TORCH_FOLDERS = ("torchinductor_",)
"""What torch itself leaves in the temporary directory on any run (its compile cache; its agent's
log folder, `torchelastic_*`, no longer: trainer.distributed.launch gives the agent one it
removes)."""


def _ranks(job: int) -> list[Proc]:
    """The running rank processes under `job` (their agent's children)."""
    procs = processes()
    under, grew = {job}, True
    while grew:
        more = {p.pid for p in procs if p.ppid in under} - under
        under, grew = under | more, bool(more)
    return [p for p in procs if p.pid in under and RANK_MODULE in p.argv and p.state != "Z"]


def _running(ranks: list[Proc]) -> list[int]:
    pids = {p.pid for p in ranks}
    return [p.pid for p in processes() if p.pid in pids and p.state != "Z"]


def test_a_killed_bench_train_ends_its_ranks_and_removes_its_data_in_one_line(
    tmp_path: Path,
) -> None:
    job = start_cli_job(
        ["bench", "train", "--model", "demo", "--steps", "2", "--rounds", "1",
         "--quality-steps", "2"],
        tmp_path,
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    ranks: list[Proc] = []
    try:
        ranks = wait_for_ranks(job, lambda: _ranks(job.pid))
        os.kill(job.pid, signal.SIGTERM)  # a `kill`: the benchmark alone
        job.wait(timeout=60)
        time.sleep(0.2)  # what the benchmark signalled last has had time to go
        assert _running(ranks) == [], "its ranks run on"
    finally:
        for pid in _running(ranks):
            os.kill(pid, signal.SIGKILL)
        kill_session(job.pid)
        _, stderr = job.communicate(timeout=60)
    assert job.returncode == 143, stderr[-3000:]
    assert stderr.splitlines() == ["interrupted: nothing measured"], stderr
    ours = [p.name for p in tmp_path.iterdir() if not p.name.startswith(TORCH_FOLDERS)]
    assert ours == [], "its temporary folders are left"
