"""DLRM and DCNv2 over an unsharded EmbeddingBagCollection: shapes, features read by name."""

from __future__ import annotations

import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shardrec.trainer.job.model_section import ModelConfig
from shardrec.trainer.model import models
from shardrec.trainer.model.models import build_model


def _ebc(dims=(4, 4, 4)) -> EmbeddingBagCollection:
    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=d, num_embeddings=10, feature_names=[f"f{i}"]
        )
        for i, d in enumerate(dims)
    ]
    return EmbeddingBagCollection(tables=tables)


DLRM = ModelConfig(arch="dlrm", embedding_dim=4, dense_arch=[8, 4], over_arch=[8, 1])


def _kjt(keys, batch=5) -> KeyedJaggedTensor:
    lengths = torch.tensor([1, 2, 0, 1, 1] * len(keys))[: batch * len(keys)]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.randint(0, 10, (int(lengths.sum()),)), lengths=lengths
    )


def test_dlrm_gives_one_logit_per_sample_and_reads_features_by_name() -> None:
    torch.manual_seed(0)
    model = build_model(DLRM, _ebc(), ["f0", "f1", "f2"], 3)
    dense = torch.randn(5, 3)
    kjt = _kjt(["f0", "f1", "f2"])
    out = model(dense, kjt)
    assert out.shape == (5,)
    # The same features in another key order give the same logits.
    perm = kjt.permute([2, 0, 1])
    assert torch.allclose(model(dense, perm), out)
    # 3 embeddings + the dense vector: 6 pairwise dots, plus the dense vector itself.
    assert model.interaction.out_features(4) == 4 + 6


def test_dcnv2_takes_mixed_widths_and_dlrm_refuses_them() -> None:
    dcn = ModelConfig(
        arch="dcnv2", dense_arch=[8, 6], over_arch=[8, 1], dcn_layers=2, dcn_low_rank=3
    )
    model = build_model(dcn, _ebc((4, 8, 2)), ["f0", "f1", "f2"], 3)
    assert model(torch.randn(5, 3), _kjt(["f0", "f1", "f2"])).shape == (5,)
    assert model.interaction.out_features(6) == 6 + 4 + 8 + 2
    with pytest.raises(ValueError, match="embedding width"):
        build_model(DLRM, _ebc((4, 8, 2)), ["f0", "f1", "f2"], 3)
    with pytest.raises(ValueError, match="no embedding table serves feature"):
        build_model(DLRM, _ebc(), ["f0", "f1", "f9"], 3)


@pytest.mark.parametrize("autocast", [False, True])
def test_the_dot_interaction_is_autograds_own_arithmetic_bit_for_bit(autocast: bool) -> None:
    """PairwiseDots: the same forward and gradient bits as bmm(X, X^T)[:, rows, cols] of the
    stacked rows under autograd, in fp32 and under bf16 autocast (there with a bf16 dense row
    beside fp32 embeddings, as the model's): a change of rounding would move every run."""
    torch.manual_seed(0)
    width = 27
    rows, cols = torch.triu_indices(width, width, offset=1)
    dense = torch.randn(64, 16, requires_grad=True)
    sparse = [torch.randn(64, 16, requires_grad=True) for _ in range(width - 1)]
    grad = torch.randn(64, len(rows))

    def run(fn):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            first = dense.to(torch.bfloat16) if autocast else dense * 1.0
            out = fn([first] + [t * 1.0 for t in sparse])  # non-leaves, as in the model
        grads = torch.autograd.grad(out, [dense, *sparse], grad.to(out.dtype))
        return out, grads

    def autograds(inputs):
        x = torch.stack(inputs, dim=1)
        return torch.bmm(x, x.transpose(1, 2))[:, rows, cols]

    ours = run(lambda inputs: models.PairwiseDots.apply(rows * width + cols, *inputs))
    theirs = run(autograds)
    assert torch.equal(ours[0], theirs[0])
    assert all(torch.equal(a, b) for a, b in zip(ours[1], theirs[1]))
    x64 = [torch.randn(3, 4, dtype=torch.float64, requires_grad=True) for _ in range(5)]
    r5, c5 = torch.triu_indices(5, 5, offset=1)
    assert torch.autograd.gradcheck(lambda *t: models.PairwiseDots.apply(r5 * 5 + c5, *t), x64)


def test_auto_compiles_large_dense_layers_on_cpu_only() -> None:
    big = models.COMPILE_MIN_DENSE_PARAMS
    has_cxx = models.cpp_compiler() is not None
    assert models.resolve_compile("auto", "cpu", big) is has_cxx
    assert not models.resolve_compile("auto", "cpu", big - 1)  # the demo's 30 k: eager
    assert not models.resolve_compile("auto", "cuda", big)  # not yet tested there
    assert models.resolve_compile("on", "cuda", 1) and not models.resolve_compile("off", "cpu", big)


def test_compiling_on_cpu_keeps_each_compiled_part_one_graph_under_ddp(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """DDP's graph splitting cut the over MLP at its first gradient bucket, where inductor's C++
    code then stored a ReLU's bool mask element by element (7.3 ms a step of the reference
    model's fp32 step): on CPU the compiled parts stay whole; on CUDA DDP's overlap is kept."""
    monkeypatch.setattr(torch._dynamo.config, "optimize_ddp", True)
    model = build_model(DLRM, _ebc(), ["f0", "f1", "f2"], 3)
    model.device_type = "cuda"
    model.compile_dense()
    assert torch._dynamo.config.optimize_ddp is True
    model.device_type = "cpu"
    model.compile_dense()
    assert torch._dynamo.config.optimize_ddp is False


def test_compiled_layers_run_in_training_only(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = build_model(DLRM, _ebc(), ["f0", "f1", "f2"], 3)
    calls: list[str] = []
    model._compiled = (
        lambda x: calls.append("dense") or model._dense(x),
        lambda d, s: calls.append("head") or model._head(d, s),
    )
    dense, kjt = torch.randn(5, 3), _kjt(["f0", "f1", "f2"])
    trained = model(dense, kjt)
    assert calls == ["dense", "head"] and model.compiled
    model.eval()
    assert torch.equal(model(dense, kjt), trained) and calls == ["dense", "head"]
