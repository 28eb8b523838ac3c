"""The timing harness of `shardrec bench train`, shared by every variant (the stock-torchrec
baseline imports this and nothing else of shardrec: keep it free of shardrec imports)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.distributed as dist


def timed_rate(fn: Callable[[], object], samples: int) -> float:
    """`samples` / seconds that `fn` took, every rank starting and stopping together (barriers)."""
    _settle()
    start = time.perf_counter()
    fn()
    _settle()
    return samples / (time.perf_counter() - start)


def _settle() -> None:
    # CUDA kernels run behind the host: the clock reads only after this rank's queued work is done.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    if dist.is_initialized():
        dist.barrier()
