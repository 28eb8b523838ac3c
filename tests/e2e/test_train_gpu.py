"""The same trainer on CUDA/NCCL (pinned batches, fbgemm's CUDA kernels); skipped without CUDA."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import TINY_MODEL, settings, train_command

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_trains_on_cuda_with_the_pipeline(tiny_dataset: Path, tmp_path: Path) -> None:
    ranks = min(2, torch.cuda.device_count())
    job = settings(
        *TINY_MODEL,
        'train.device="cuda"',
        'train.pipeline="sparse_dist"',
        "train.global_batch_size=64",
        "train.epochs=2",
    )
    cmd = train_command(tiny_dataset, tmp_path / "run", *job, nproc=ranks)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["steps"] == 30 and summary["eval"]["val"]["auc"] > 0.6
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["fingerprint"]["device_kind"] == "cuda"
