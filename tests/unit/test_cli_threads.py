"""`shardrec preprocess` runs numpy's BLAS on one thread (it never uses it; with more, numpy's
import starts threads that spin idle, ~0.1 CPU-s per process), unless the user set it; other
commands (train's ranks: torch's GEMMs are OpenBLAS's on aarch64) keep numpy's default."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import os, sys
from shardrec.tools.cli import entry
try:
    entry.main()
except SystemExit:
    pass
import numpy  # a command's first import of it
print(os.environ.get("OPENBLAS_NUM_THREADS"), len(os.listdir("/proc/self/task")))
"""


def _run(args: list[str], env_value: str | None) -> list[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
    }
    if env_value is not None:
        env["OPENBLAS_NUM_THREADS"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.split()[-2:]


def _usable_cpus() -> int:
    # OpenBLAS sizes its pool by the CPUs this process may run on (taskset), not the machine's.
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.mark.skipif(_usable_cpus() < 2, reason="numpy's BLAS runs one thread here anyway")
def test_a_preprocess_process_holds_no_idle_blas_threads():
    assert _run(["preprocess", "--help"], None) == ["1", "1"]  # one thread: the process's own
    assert _run(["preprocess", "--help"], "2") == ["2", "2"]  # the user's own setting stands
    assert _run(["runs", "--help"], None)[0] == "None"  # another command: numpy's default


BIND = """
import os, sys
from shardrec.trainer.distributed.dist import bind_to_cores
rank, ranks = int(sys.argv[1]), int(sys.argv[2])
print(bind_to_cores(rank, ranks), sorted(os.sched_getaffinity(0)))
"""


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_cpu_ranks_are_bound_to_equal_shares_of_the_cores_or_not_at_all(ranks: int) -> None:
    # dist.bind_cores: local rank r of `ranks` runs on its share of the cores this process may
    # use, in order; one rank, or cores that do not split evenly, stay where the OS puts them.
    from shardrec.trainer.distributed.dist import core_order

    cpus = core_order(os.sched_getaffinity(0))
    share = len(cpus) // ranks
    for rank in range(ranks):
        out = subprocess.run(
            [sys.executable, "-c", BIND, str(rank), str(ranks)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if ranks == 1 or len(cpus) % ranks:
            assert out == f"None {sorted(cpus)}"
        else:
            mine = cpus[rank * share : (rank + 1) * share]
            assert out == f"{mine} {mine}"


def test_a_ranks_share_is_whole_cores_where_smt_threads_are_numbered_apart(tmp_path) -> None:
    # 4 CPUs as most Intel hosts number them: 0 and 2 are core 0's threads, 1 and 3 core 1's.
    # In number order two ranks would get {0, 1} and {2, 3}: each other's siblings.
    from shardrec.trainer.distributed.dist import core_order

    for cpu, core in ((0, 0), (1, 1), (2, 0), (3, 1)):
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text("0\n")
        (topology / "core_id").write_text(f"{core}\n")
    assert core_order({0, 1, 2, 3}, tmp_path) == [0, 2, 1, 3]
    assert core_order({3, 1, 0}, tmp_path / "none") == [0, 1, 3]  # no topology: number order


EVAL_RANK = """
import os, sys
from pathlib import Path
from shardrec.trainer.distributed import dist
from shardrec.trainer.distributed.lifeline import PARENT_PID_ENV
from shardrec.trainer.inference import eval_entry
from shardrec.trainer.inference.eval_request import EvalRequest

class Joined(BaseException):
    pass

def joined(device_kind="auto", timeout_s=600, bind_cores=False):  # where the rank joins the group
    print(bind_cores, flush=True)
    raise Joined

dist.init_distributed = joined
for run in map(Path, sys.argv[1:]):  # an eval rank of each run in turn: one import of torchrec
    (run / "request.json").write_text(EvalRequest(run).to_json())
    os.environ.pop(PARENT_PID_ENV, None)  # the rank before named itself its parent: a fresh rank
    try:
        eval_entry.rank_main(run / "request.json", run / "result.json")
    except Joined:
        pass
"""


def test_eval_ranks_bind_to_cores_as_the_runs_training_ranks_did(tmp_path) -> None:
    # Before, eval's ranks were never bound: 2 CPU ranks' threads migrated between the cores.
    runs = [tmp_path / "default", tmp_path / "unbound"]
    for run, setting in zip(runs, ["", "[dist]\nbind_cores = false\n"]):
        run.mkdir()
        (run / "config.toml").write_text(setting)
    out = subprocess.run(
        [sys.executable, "-c", EVAL_RANK, *map(str, runs)], capture_output=True, text=True
    )
    assert out.stdout.split() == ["True", "False"], out.stderr[-2000:]


@pytest.mark.skipif(_usable_cpus() < 2, reason="one core: every share is one thread anyway")
def test_cpu_ranks_share_the_cores_the_job_may_use_not_the_machines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before, under `taskset -c 0` on 2 cores each rank got OMP_NUM_THREADS=2 (os.cpu_count()):
    # two threads on the one core it may use (bound there too: dist.bind_to_cores).
    from shardrec.trainer.distributed.launch import rank_environment

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    try:
        assert rank_environment(1)["OMP_NUM_THREADS"] == "1"
    finally:
        os.sched_setaffinity(0, allowed)
    assert rank_environment(1)["OMP_NUM_THREADS"] == str(len(allowed))


def test_more_cpu_ranks_than_cores_is_said_before_they_start(
    tiny_dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, `shardrec train --nproc-per-node 2` on one usable core started both without a word.
    from helpers import jobs_handed_to_ranks
    from typer.testing import CliRunner

    from shardrec.tools.cli.app import app

    jobs_handed_to_ranks(monkeypatch)  # no rank starts: the launch "fails", exit 1
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(allowed)})
    job = ["--data", str(tiny_dataset), "--set", "train.global_batch_size=64"]
    job += ["--set", 'train.device="cpu"']
    try:
        said = {
            ranks: CliRunner().invoke(app, ["train", *job, "--nproc-per-node", str(ranks)]).stderr
            for ranks in (1, 2)
        }
    finally:
        os.sched_setaffinity(0, allowed)
    warning = (
        "warning: --nproc-per-node 2: 2 CPU ranks on the 1 core this job may use: ranks that "
        "share a core take turns on it and wait on each other at every collective; start at most "
        "1 here unless you mean to"
    )
    assert warning in said[2].splitlines(), said[2]
    assert "warning" not in said[1], said[1]
