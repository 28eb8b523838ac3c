"""A lost or hung rank (README, Failures and trust: Training): collective and checkpoint timeouts
are settings of their own, and a rank that never reaches a checkpoint barrier is named (2 local
ranks, a 2 s checkpoint timeout)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from shardrec.trainer.distributed.local_ranks import RankFailed, run_local_ranks
from shardrec.trainer.job.config import load_job_config


def test_timeouts_have_defaults_are_settable_and_validated() -> None:
    config = load_job_config(None, [])
    assert (config.dist.timeout_s, config.checkpoint.timeout_s) == (600, 1800)
    config = load_job_config(None, ["dist.timeout_s=30", "checkpoint.timeout_s=7200"])
    assert (config.dist.timeout_s, config.checkpoint.timeout_s) == (30, 7200)
    assert "[dist]\ntimeout_s = 30" in config.to_toml()  # the run directory keeps them
    for item, message in (
        ("dist.timeout_s=0", "dist.timeout_s = 0 must be > 0"),
        ("checkpoint.timeout_s=-5", "checkpoint.timeout_s = -5 must be > 0"),
        ('dist.timeout_s="long"', 'dist.timeout_s = "long"'),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            load_job_config(None, [item])


def _rank_one_never_saves(env, directory: str, dies: bool = False, timeout_s: float = 2) -> int:
    """Rank 1 never reaches the checkpoint: it hangs past `timeout_s`, or (`dies`) its process
    ends at once."""
    import os

    import torch

    from shardrec.trainer.rundir.checkpoint.manager import CheckpointManager
    from shardrec.trainer.rundir.checkpoint.parts import CheckpointParts, ModuleState, TrainProgress

    parts = CheckpointParts(
        progress=TrainProgress(step=5),
        sharded={"model": ModuleState(torch.nn.Linear(2, 2))},
        main={},
        signature={},
        layout="{}",
    )
    manager = CheckpointManager(Path(directory), env, keep=1, parts=parts, timeout_s=timeout_s)
    if env.rank == 1 and dies:
        os._exit(9)
    if env.rank == 1:
        time.sleep(4)  # lost: never reaches the checkpoint (then leaves, so the harness ends)
        return 1
    manager.save()
    return 0


def test_a_rank_missing_from_a_checkpoint_barrier_is_named(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(RankFailed) as caught:
        run_local_ranks(_rank_one_never_saves, 2, str(tmp_path), timeout_s=60)
    assert caught.value.rank == 0
    assert caught.value.reason == (
        "shardrec.trainer.distributed.dist.RankMissing: checkpoint of step 5: start: "
        "rank 1 of 2 did not arrive within 2 s (checkpoint.timeout_s)"
    )
    assert time.monotonic() - start < 60  # the 2 s timeout, not the collectives' 600 s
    assert not (tmp_path / "step-00000005").exists()


def test_a_rank_that_dies_before_a_checkpoint_barrier_is_not_said_to_time_out(
    tmp_path: Path,
) -> None:
    # Before: "rank 1 of 2 did not arrive within 60 s (checkpoint.timeout_s)" at once (gloo's own
    # words for a closed connection), as rank 0 of a two-node torchrun said seconds after node 1
    # was killed, claiming a wait of 1800 s that never happened.
    with pytest.raises(RankFailed) as caught:
        run_local_ranks(_rank_one_never_saves, 2, str(tmp_path), True, 60, timeout_s=120)
    assert caught.value.rank == 0
    assert re.fullmatch(
        re.escape(
            "shardrec.trainer.distributed.dist.RankMissing: checkpoint of step 5: start: "
            "rank 1 of 2 left the job after "
        )
        + r"\d+\.\d s"
        + re.escape(
            " of this wait, without arriving (its process ended or its connection broke; the "
            "wait is up to 60 s, checkpoint.timeout_s)"
        ),
        caught.value.reason,
    ), caught.value.reason
