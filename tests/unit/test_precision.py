"""train.precision: bf16 autocast over the dense layers and the interaction, fp32 everywhere
else; `auto` picks bf16 only where it is native, an explicit bf16 where it is emulated is measured
and refused unless insisted on."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from helpers import assert_one_line_error
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from typer.testing import CliRunner

from shardrec.tools.cli.app import app
from shardrec.trainer.job import precision
from shardrec.trainer.job.config import load_job_config
from shardrec.trainer.job.model_section import ModelConfig
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
    assert load_job_config(None, []).train.precision == "fp32"  # the demo's, on every machine
    with pytest.raises(
        ValueError, match=r"train.precision = 'fp16' is not one of fp32, bf16, auto$"
    ):
        load_job_config(None, ['train.precision="fp16"'])


def _cpu_bf16(monkeypatch: pytest.MonkeyPatch, avx512_bf16: bool, amx: bool) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)


@pytest.mark.parametrize("avx512_bf16, amx", [(True, False), (False, True), (False, False)])
def test_auto_picks_bf16_only_on_a_cpu_with_native_bf16(
    monkeypatch: pytest.MonkeyPatch, avx512_bf16: bool, amx: bool
) -> None:
    _cpu_bf16(monkeypatch, avx512_bf16, amx)
    native = avx512_bf16 or amx
    assert precision.resolve_precision("auto", "cpu") == ("bf16" if native else "fp32")
    assert precision.resolve_precision("fp32", "cpu") == "fp32"
    assert precision.resolve_precision("bf16", "cpu") == "bf16"  # explicit: checked, not changed


@pytest.mark.parametrize(
    "avx512_bf16, amx, says",
    [
        (
            True,
            True,
            "bf16 on this CPU, which computes bf16 matmuls natively (AMX and AVX512-BF16)",
        ),
        (False, True, "bf16 on this CPU, which computes bf16 matmuls natively (AMX)"),
        (True, False, "bf16 on this CPU, which computes bf16 matmuls natively (AVX512-BF16)"),
        (False, False, "fp32 on this CPU (this CPU has no AVX512-BF16 or AMX instructions"),
    ],
)
def test_auto_says_at_start_what_it_picked_and_why(
    monkeypatch: pytest.MonkeyPatch, avx512_bf16: bool, amx: bool, says: str
) -> None:
    _cpu_bf16(monkeypatch, avx512_bf16, amx)
    assert precision.auto_precision_line("cpu").startswith(f"train.precision = auto: {says}")


def test_auto_picks_bf16_only_on_a_gpu_with_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.cuda.is_bf16_supported() counts emulation by default (True on a V100 or T4)."""
    monkeypatch.setattr(
        torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation
    )
    assert precision.resolve_precision("auto", "cuda") == "fp32"
    note = precision.bf16_support_note("cuda")
    assert note is not None and "no native bf16" in note and "emulated and slow" in note
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert precision.resolve_precision("auto", "cuda") == "bf16"
    assert precision.bf16_support_note("cuda") is None


def test_explicit_bf16_on_an_emulating_cpu_is_measured_and_refused_unless_insisted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _cpu_bf16(monkeypatch, False, False)
    monkeypatch.setattr(precision, "bf16_slowdown", lambda device="cpu": 14.2)
    with pytest.raises(ValueError) as refused:
        precision.check_precision("bf16", "cpu", allow_emulated=False)
    assert str(refused.value) == (
        "train.precision = 'bf16': bf16 matmuls run 14.2x slower than fp32 on this CPU (this CPU "
        'has no AVX512-BF16 or AMX instructions: under train.precision = "bf16" its matmuls are '
        "emulated and likely slower than fp32); train in fp32 (or 'auto', bf16 only where it is "
        "native), or set train.allow_emulated_bf16 = true to insist"
    )
    note = precision.check_precision("bf16", "cpu", allow_emulated=True)
    assert note is not None and note.startswith("bf16 matmuls run 14.2x slower than fp32")
    assert note.endswith("training in bf16 anyway (train.allow_emulated_bf16 = true)")
    # Nothing to measure or refuse: fp32, or bf16 where it is native.
    assert precision.check_precision("fp32", "cpu", allow_emulated=False) is None
    _cpu_bf16(monkeypatch, False, True)
    assert precision.check_precision("bf16", "cpu", allow_emulated=False) is None


def test_the_bf16_probe_times_real_matmuls_in_well_under_a_second() -> None:
    start = time.perf_counter()
    slowdown = precision.bf16_slowdown("cpu")
    assert 0 < slowdown < 1000 and time.perf_counter() - start < 1.5


def test_train_refuses_bf16_on_an_emulating_cpu_in_one_line_with_the_measured_slowdown(
    monkeypatch: pytest.MonkeyPatch, tiny_dataset: Path
) -> None:
    """What the user sees, before any rank starts: one line with the probe's figure. The CPU's
    flags and the probe's figure are injected, whatever this machine has."""
    _cpu_bf16(monkeypatch, False, False)
    monkeypatch.setattr(precision, "bf16_slowdown", lambda device="cpu": 14.2)
    job = ["--data", str(tiny_dataset), "--set", "train.global_batch_size=64"]
    result = CliRunner().invoke(app, ["train", *job, "--set", 'train.precision="bf16"'])
    assert_one_line_error(
        result,
        r"^error: --set '.*': train.precision = 'bf16': bf16 matmuls run 14\.2x slower than fp32 on this CPU "
        r"\(this CPU has no AVX512-BF16 or AMX instructions: .*\); train in fp32 .*"
        r"or set train.allow_emulated_bf16 = true to insist$",
    )


@pytest.mark.parametrize(
    "slowdown, refused", [(14.2, True), (1.01, True), (1.0, False), (0.4, False)]
)
def test_only_a_measured_slowdown_refuses_bf16(
    monkeypatch: pytest.MonkeyPatch, slowdown: float, refused: bool
) -> None:
    """A CPU that reports no native bf16 but whose bf16 matmuls are no slower trains in bf16,
    saying so: the refusal is about speed, and a wrong 'slower' would be a wrong answer."""
    _cpu_bf16(monkeypatch, False, False)
    monkeypatch.setattr(precision, "bf16_slowdown", lambda device="cpu": slowdown)
    if refused:
        with pytest.raises(ValueError, match=rf"run {slowdown:.1f}x slower than fp32 on this CPU"):
            precision.check_precision("bf16", "cpu", allow_emulated=False)
    else:
        note = precision.check_precision("bf16", "cpu", allow_emulated=False)
        assert note == (
            f"bf16 matmuls run {1 / slowdown:.1f}x faster than fp32 on this CPU though it "
            "reports no native bf16: training in bf16"
        )
