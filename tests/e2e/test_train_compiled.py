"""train.compile = "on": the dense layers and the interaction run torch.compile'd on 2 CPU ranks; a
run killed mid-way and resumed ends bitwise on the uninterrupted compiled run, and compiled layers
train as the eager ones (losses step by step)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import TINY_MODEL, settings, train_command

JOB = settings(
    'train.device="cpu"',
    *TINY_MODEL,
    "train.global_batch_size=64",
    "train.steps=12",
    "train.log_interval=1",
    "checkpoint.interval_steps=4",
    "checkpoint.keep=3",
    'data.eval_splits=["val"]',
    'train.compile="on"',
)


def _train(data: Path, run_dir: Path, *extra: str, fault: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SHARDREC_FAULT"}
    if fault:
        env["SHARDREC_FAULT"] = fault
    cmd = train_command(data, run_dir, *JOB, *extra)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def _final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ckpt = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    dcp_to_torch_save(ckpt, run_dir / "final.pt")
    return torch.load(run_dir / "final.pt", weights_only=False)["model"]


@pytest.mark.slow
def test_a_killed_compiled_run_resumes_bitwise(tiny_dataset: Path, tmp_path: Path) -> None:
    # Rank 1 is killed after step 6; torchrun restarts both ranks, which resume from step 4 and
    # compile again.
    killed = _train(tiny_dataset, tmp_path / "killed", "--max-restarts", "1", fault="kill:6:1:0")
    assert killed.returncode == 0, killed.stderr[-3000:]
    assert json.loads(killed.stdout)["resumed_from_step"] == 4
    assert "compiling the dense layers and the interaction" in killed.stderr
    whole = _train(
        tiny_dataset, tmp_path / "whole", "--plan", str(tmp_path / "killed" / "plan.json")
    )
    assert whole.returncode == 0, whole.stderr[-3000:]
    a, b = _final_model(tmp_path / "killed"), _final_model(tmp_path / "whole")
    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, b[key]), f"resumed compiled run differs in {key}"


def test_compiled_dense_layers_train_as_the_eager_ones() -> None:
    """One process, the same model and batches: compiled kernels round differently (fused,
    reordered sums), so the curves agree, not the bits."""
    from torchrec.datasets.utils import Batch
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from shardrec.trainer.job.model_section import ModelConfig
    from shardrec.trainer.model.models import build_model
    from shardrec.trainer.model.objective import TrainModule
    from shardrec.trainer.model.train_optimizer import build_dense_optimizer

    features = [f"f{i}" for i in range(4)]
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(12):
        ids = torch.randint(0, 50, (64 * len(features),), generator=gen)
        kjt = KeyedJaggedTensor.from_lengths_sync(features, ids, torch.ones_like(ids))
        dense = torch.randn(64, 5, generator=gen)
        labels = ((dense[:, 0] + (ids[:64] % 3 == 0)) > 0.5).float()
        batches.append(Batch(dense_features=dense, sparse_features=kjt, labels=labels))

    def train(compiled: bool) -> list[float]:
        torch.manual_seed(0)
        tables = [EmbeddingBagConfig(name=f"t{f}", embedding_dim=8, num_embeddings=50,
                                     feature_names=[f]) for f in features]  # fmt: skip
        config = ModelConfig(embedding_dim=8, dense_arch=[16, 8], over_arch=[16, 1])
        model = build_model(config, EmbeddingBagCollection(tables=tables), features, 5)
        if compiled:
            model.compile_dense()
        module = TrainModule(model, 64, 1)
        opt = build_dense_optimizer(
            list(module.parameters()), optimizer="adagrad", lr=0.05, eps=1e-8
        )
        losses = []
        for batch in batches:
            opt.zero_grad()
            loss, _ = module(batch)
            loss.backward()
            opt.step()
            losses.append(float(loss))
        return losses

    eager, compiled = train(False), train(True)
    assert compiled == pytest.approx(eager, rel=1e-4) and eager[-1] < eager[0]
