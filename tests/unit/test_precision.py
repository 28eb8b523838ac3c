"""train.precision: bf16 autocast over the dense layers and the interaction, fp32 everywhere
else."""

from __future__ import annotations

import pytest
import torch
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shardrec.trainer.job.config import ModelConfig, load_job_config
from shardrec.trainer.model import models
from shardrec.trainer.model.models import build_model
from shardrec.trainer.model.objective import TrainModule

FEATURES = ["f0", "f1", "f2"]


def _batch(n: int = 6) -> Batch:
    lengths = torch.ones(n * len(FEATURES), dtype=torch.int64)
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=FEATURES, values=torch.randint(0, 10, (n * len(FEATURES),)), lengths=lengths
    )
    return Batch(
        dense_features=torch.randn(n, 3), sparse_features=kjt, labels=torch.randint(0, 2, (n,))
    )


def _module(arch: str, precision: str) -> TrainModule:
    torch.manual_seed(0)
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=4, num_embeddings=10, feature_names=[f])
        for i, f in enumerate(FEATURES)
    ]
    config = ModelConfig(
        arch=arch,
        embedding_dim=4,
        dense_arch=[8, 4],
        over_arch=[8, 1],
        dcn_layers=1,
        dcn_low_rank=2,
    )
    return TrainModule(
        build_model(
            config, EmbeddingBagCollection(tables=tables), FEATURES, 3, precision=precision
        ),
        6,
        1,
    )


def _matmul_dtypes(module: TrainModule) -> dict[str, torch.dtype]:
    """Output dtype of every Linear (the MLPs, DCN's cross layers) in one forward + backward."""
    seen: dict[str, torch.dtype] = {}
    hooks = [
        m.register_forward_hook(lambda mod, args, out, name=name: seen.__setitem__(name, out.dtype))
        for name, m in module.named_modules()
        if isinstance(m, torch.nn.Linear)
    ]
    loss, (loss_sum, logits, _, _) = module(_batch())
    loss.backward()
    for h in hooks:
        h.remove()
    seen["loss"], seen["logits"], seen["loss_sum"] = loss.dtype, logits.dtype, loss_sum.dtype
    return seen


@pytest.mark.parametrize("arch", ["dlrm", "dcnv2"])
def test_bf16_runs_the_dense_matmuls_in_bf16_and_keeps_loss_and_weights_fp32(arch: str) -> None:
    module = _module(arch, "bf16")
    seen = _matmul_dtypes(module)
    linears = {k: v for k, v in seen.items() if k not in ("loss", "logits", "loss_sum")}
    assert len(linears) >= 3 and set(linears.values()) == {torch.bfloat16}, linears
    assert (seen["loss"], seen["logits"], seen["loss_sum"]) == (torch.float32,) * 3
    # Weights and their gradients stay fp32 (what the optimizers and checkpoints see).
    assert {p.dtype for p in module.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in module.parameters() if p.grad is not None} == {torch.float32}


def test_fp32_runs_no_bf16_and_bf16_changes_the_logits() -> None:
    seen = _matmul_dtypes(_module("dlrm", "fp32"))
    assert set(seen.values()) == {torch.float32}
    batch = _batch()
    torch.manual_seed(1)
    fp32, bf16 = _module("dlrm", "fp32"), _module("dlrm", "bf16")
    out32, out16 = (
        fp32.model(batch.dense_features, batch.sparse_features),
        bf16.model(batch.dense_features, batch.sparse_features),
    )
    assert not torch.equal(out32, out16)  # autocast really ran: same weights, rounded matmuls
    torch.testing.assert_close(out16, out32, atol=0.05, rtol=0.05)


def test_precision_is_validated() -> None:
    assert load_job_config(None, ['train.precision="bf16"']).train.precision == "bf16"
    with pytest.raises(ValueError, match=r"train.precision = 'fp16' is not one of fp32, bf16$"):
        load_job_config(None, ['train.precision="fp16"'])


def test_a_cpu_without_bf16_instructions_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    note = models.bf16_support_note("cpu")
    assert note is not None and "no AVX512-BF16 or AMX" in note and "slower than fp32" in note
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    assert models.bf16_support_note("cpu") is None


def test_a_gpu_that_only_emulates_bf16_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.cuda.is_bf16_supported() counts emulation by default (True on a V100 or T4)."""
    monkeypatch.setattr(
        torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation
    )
    note = models.bf16_support_note("cuda")
    assert note is not None and "no native bf16" in note and "emulated and slow" in note
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert models.bf16_support_note("cuda") is None
