"""The same trainer on CUDA/NCCL (pinned batches, fbgemm's CUDA kernels); skipped without CUDA."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_trains_on_cuda_with_the_pipeline(tiny_dataset: Path, tmp_path: Path) -> None:
    ranks = min(2, torch.cuda.device_count())
    cmd = [
        sys.executable,
        "-m",
        "shardrec.tools.cli",
        "train",
        "--data",
        str(tiny_dataset),
        "--out-dir",
        str(tmp_path / "run"),
        "--nproc-per-node",
        str(ranks),
        "--json",
        "--set",
        'train.device="cuda"',
        "--set",
        'train.pipeline="sparse_dist"',
        "--set",
        "train.global_batch_size=64",
        "--set",
        "train.epochs=2",
        "--set",
        "model.embedding_dim=8",
        "--set",
        "model.dense_arch=[16, 8]",
        "--set",
        "model.over_arch=[16, 1]",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert summary["steps"] == 30 and summary["eval"]["val"]["auc"] > 0.6
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["fingerprint"]["device_kind"] == "cuda"
