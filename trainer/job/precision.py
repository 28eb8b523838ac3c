"""train.precision: the dtype of the dense layers' and the interaction's matmuls, and whether this
machine computes it natively.

bf16 pays only where the hardware has it: CPUs with AVX512-BF16 or AMX, GPUs of compute capability
8.0 or more. Elsewhere oneDNN (CPU) or the GPU emulates it, and bf16 matmuls are slower than fp32
ones (0.07x the reference on an AVX2-only EPYC, against 1.68x on an AVX512-BF16 host). So:

- `auto` picks bf16 only where it is native, fp32 elsewhere;
- an explicit `bf16` where it is emulated measures the slowdown at start (matmuls of both dtypes,
  well under a second), says it, and refuses unless `train.allow_emulated_bf16` insists.
"""

from __future__ import annotations

import time

import torch

PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}
"""A resolved train.precision -> the autocast dtype of the dense layers (None: no autocast)."""
INSIST = "train.allow_emulated_bf16"
PROBE_SIZE = 256
PROBE_BUDGET_S = (0.05, 0.25)
"""Seconds spent timing fp32 and bf16 matmuls (at least 3 of each)."""


def native_bf16(device_type: str) -> bool:
    """Whether this machine's `device_type` (cpu or cuda) has native bf16 matmuls."""
    if device_type == "cuda":
        # Emulation does not count: a pre-Ampere GPU (V100, T4) makes bf16 tensors, but slowly.
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    return bool(_cpu_bf16_units())


def _cpu_bf16_units() -> list[str]:
    """This CPU's units with native bf16 dot products (oneDNN emulates bf16 without them)."""
    units = {
        "AMX": torch.cpu._is_amx_tile_supported(),
        "AVX512-BF16": torch.cpu._is_avx512_bf16_supported(),
    }
    return [name for name, present in units.items() if present]


def native_bf16_units(device_type: str) -> list[str]:
    """What gives this machine's `device_type` native bf16 matmuls, by name (empty: none)."""
    if device_type == "cuda":
        if not native_bf16("cuda"):
            return []
        major, minor = torch.cuda.get_device_capability()
        return [f"compute capability {major}.{minor}"]
    return _cpu_bf16_units()


def auto_precision_line(device_type: str) -> str:
    """The start-up line of train.precision = auto: what it picked on this machine, and why."""
    units = native_bf16_units(device_type)
    kind = "CPU" if device_type == "cpu" else "GPU"
    if units:
        return (
            f"train.precision = auto: bf16 on this {kind}, which computes bf16 matmuls natively "
            f"({' and '.join(units)})"
        )
    return f"train.precision = auto: fp32 on this {kind} ({bf16_support_note(device_type)})"


def resolve_precision(precision: str, device_type: str) -> str:
    """fp32 or bf16: `auto` is bf16 where it is native, fp32 elsewhere."""
    if precision == "auto":
        return "bf16" if native_bf16(device_type) else "fp32"
    return precision


def bf16_support_note(device_type: str) -> str | None:
    """Why bf16 autocast would run slowly on this machine, or None where it is native."""
    if native_bf16(device_type):
        return None
    if device_type == "cuda":
        return (
            "this GPU has no native bf16 (compute capability below 8.0): "
            'train.precision = "bf16" is emulated and slow'
        )
    return (
        'this CPU has no AVX512-BF16 or AMX instructions: under train.precision = "bf16" its '
        "matmuls are emulated and likely slower than fp32"
    )


def _seconds_per_matmul(dtype: torch.dtype, device: torch.device, budget_s: float) -> float:
    a = torch.randn(PROBE_SIZE, PROBE_SIZE, device=device).to(dtype)
    torch.mm(a, a)  # the first call picks and loads kernels: not timed
    best, spent, runs = float("inf"), 0.0, 0
    while runs < 3 or spent < budget_s:
        start = time.perf_counter()
        torch.mm(a, a)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        took = time.perf_counter() - start
        best, spent, runs = min(best, took), spent + took, runs + 1
        if spent > 4 * budget_s:
            break
    return best


def bf16_slowdown(device: torch.device | str = "cpu") -> float:
    """How many times longer a bf16 matmul takes than an fp32 one on `device` (fastest of a
    few of each, well under a second in all)."""
    device = torch.device(device)
    fp32 = _seconds_per_matmul(torch.float32, device, PROBE_BUDGET_S[0])
    bf16 = _seconds_per_matmul(torch.bfloat16, device, PROBE_BUDGET_S[1])
    return bf16 / max(fp32, 1e-12)


def check_precision(precision: str, device_type: str, allow_emulated: bool) -> str | None:
    """Refuse (ValueError) an explicit bf16 where it is emulated, with the slowdown measured now,
    unless `allow_emulated`; then returns that measurement as a warning to log. None where there
    is nothing to say (fp32, auto, native bf16). A device that reports no native bf16 but whose
    bf16 matmuls measure no slower than fp32 ones (an instruction set these checks do not know)
    trains in bf16, with the measurement as the warning: the refusal is about speed."""
    if precision != "bf16" or native_bf16(device_type):
        return None
    slowdown = bf16_slowdown(device_type)
    kind = "CPU" if device_type == "cpu" else "GPU"
    if slowdown <= 1.0:
        return (
            f"bf16 matmuls run {1 / max(slowdown, 1e-12):.1f}x faster than fp32 on this {kind} "
            "though it reports no native bf16: training in bf16"
        )
    measured = (
        f"bf16 matmuls run {slowdown:.1f}x slower than fp32 on this {kind} "
        f"({bf16_support_note(device_type)})"
    )
    if not allow_emulated:
        raise ValueError(
            f"train.precision = 'bf16': {measured}; train in fp32 (or 'auto', bf16 only where it "
            f"is native), or set {INSIST} = true to insist"
        )
    return f"{measured}; training in bf16 anyway ({INSIST} = true)"
