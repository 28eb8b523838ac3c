"""The timing harness of `shardrec bench train`, shared by every variant (the stock-torchrec
baseline imports this and nothing else of shardrec: keep it free of shardrec imports)."""

from __future__ import annotations

import time
from typing import Callable

import torch.distributed as dist


def timed_rate(fn: Callable[[], object], samples: int) -> float:
    """`samples` / seconds that `fn` took, every rank starting and stopping together (barriers)."""
    if dist.is_initialized():
        dist.barrier()
    start = time.perf_counter()
    fn()
    if dist.is_initialized():
        dist.barrier()
    return samples / (time.perf_counter() - start)
