"""Two nodes started one by one (`python -m shardrec.trainer` on each, as torchrun starts it, one
rank per node) that do not run one job: their own run directories, other data, another --set.
Every node refuses in one line before anything is written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_tiny_dataset
from helpers import TINY_MODEL, assert_one_line_error, settings

JOB = settings(*TINY_MODEL, "train.global_batch_size=64", 'train.device="cpu"', "train.steps=4")


def _two_nodes(node_args: list[list[str]]) -> list[subprocess.CompletedProcess]:
    """Rank r of 2 with `node_args[r]`, each the first rank of its own node; both finished."""
    from shardrec.trainer.distributed.local_ranks import free_port

    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "shardrec.trainer", *args],
            env={
                **os.environ,
                **{"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2"},
                **{"LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port},
                "OMP_NUM_THREADS": "1",
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, args in enumerate(node_args)
    ]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def _node(data: Path, run: Path, *more: str) -> list[str]:
    return ["--data", str(data), "--out-dir", str(run), *JOB, *more]


@pytest.mark.parametrize("case", ["own run directories", "other data", "another --set"])
def test_nodes_that_run_different_jobs_are_refused_on_every_node(
    case: str, tiny_dataset: Path, tmp_path: Path
) -> None:
    # Before, each case trained to the end, exit code 0 on both nodes, with no word: with their
    # own --out-dir, rank 0's checkpoints held rank 0's shards alone (digests.json vouching for
    # them; `export` then failed on the missing __1_0.distcp), and rank 1's folder held only
    # .step-*.tmp folders; with another copy of the data or another optim.dense_lr, rank 1
    # trained on them while config.toml and dataset.json recorded rank 0's.
    run, other = tmp_path / "run", tmp_path / "other"
    host = "\\(host \\S+\\)"
    if case == "own run directories":
        args = [_node(tiny_dataset, run), _node(tiny_dataset, other)]
        line = (
            f"^error: {re.escape(str(other))}: rank 1 {host} does not see the files rank 0 {host} "
            f"writes in its --out-dir {re.escape(str(run))}: the run directory must be one "
            "folder on a filesystem every node sees"
        )
    elif case == "other data":
        write_tiny_dataset(tmp_path / "data1", seed=5)
        args = [_node(tiny_dataset, run), _node(tmp_path / "data1", run)]
        line = (
            f"^error: rank 1 {host} reads other data than rank 0 {host}: "
            f"{re.escape(str(tmp_path / 'data1'))} \\(fingerprint \\w{{12}}\\) on rank 1, "
            f"{re.escape(str(tiny_dataset))} \\(fingerprint \\w{{12}}\\) on rank 0; every node "
            "needs the same preprocessed dataset"
        )
    else:
        args = [_node(tiny_dataset, run), _node(tiny_dataset, run, "--set", "optim.dense_lr=0.1")]
        line = (
            f"^error: rank 1 {host} was started with other settings than rank 0 {host} "
            + re.escape("(optim.dense_lr: 0.05 on rank 0, 0.1 on rank 1): start every node")
        )
    for done in _two_nodes(args):
        assert_one_line_error(done, line)
    # Nothing written for the run: rank 0 made its folder to check it is shared, no more.
    assert not any(run.iterdir()) and not other.exists()
