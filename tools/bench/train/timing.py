"""The timing harness of `shardrec bench train`, shared by every variant (the stock-torchrec
baseline imports this and nothing else of shardrec: keep it free of shardrec imports)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist


def timed_window(fn: Callable[[], object], samples: int) -> tuple[float, float, float]:
    """(samples, wall seconds, CPU seconds) of `fn`: every rank starts and stops together
    (barriers); the CPU seconds are every rank's process (all its threads), summed."""
    _settle()
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    _settle()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if dist.is_initialized() and dist.get_world_size() > 1:
        total = torch.tensor([cpu], dtype=torch.float64)
        dist.all_reduce(total)
        cpu = float(total.item())
    return float(samples), wall, cpu


def _settle() -> None:
    # CUDA kernels run behind the host: the clock reads only after this rank's queued work is done.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    if dist.is_initialized():
        dist.barrier()
