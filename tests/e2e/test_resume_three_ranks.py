"""A run of three CPU ranks killed and resumed ends bit for bit on the uninterrupted run (README:
"Resume is exact"), as two ranks do (test_train_cli.py). Three ranks add each dense gradient's
three values in an order a sum of two never shows: DDP's first step after a resume reduced in
its first-step bucket layout, where the uninterrupted run was already in its rebuilt one."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import TINY_MODEL, final_weights, settings, train_command

JOB = settings(
    'train.device="cpu"',
    *TINY_MODEL,
    "train.global_batch_size=48",  # 16 a rank
    "train.steps=6",
    "checkpoint.interval_steps=2",
    'data.eval_splits=["val"]',
)


def _train(data: Path, run_dir: Path, fault: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SHARDREC_FAULT"}
    if fault:
        env["SHARDREC_FAULT"] = fault
    cmd = train_command(data, run_dir, *JOB, nproc=3)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_a_three_rank_run_killed_and_resumed_ends_bit_for_bit(tiny_dataset: Path, tmp_path: Path):
    straight = _train(tiny_dataset, tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = _train(tiny_dataset, tmp_path / "killed", fault="kill:3:1:0")  # after step 2's save
    assert killed.returncode != 0 and "SIGKILL" in killed.stderr, killed.stderr[-3000:]
    resumed = _train(tiny_dataset, tmp_path / "killed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout)["resumed_from_step"] == 2
    for part in ("model", "fused_optim"):
        ours, theirs = (
            final_weights(tmp_path / "killed", part),
            final_weights(tmp_path / "straight", part),
        )
        differ = [k for k, v in theirs.items() if not torch.equal(v, ours[k])]
        assert differ == [], f"{part}: {len(differ)} of {len(theirs)} differ after the resume"
    metrics = ("auc", "logloss", "ne")
    ours, theirs = (json.loads(run.stdout)["eval"]["val"] for run in (resumed, straight))
    assert {k: ours[k] for k in metrics} == {k: theirs[k] for k in metrics}
