"""Ordered background prefetch on threads.

Workers are threads, not processes: the per-batch work is numpy gathers and copies, which
release the GIL, and a batch made in a thread reaches the training loop with no copy
between processes. Results come back in submission order whatever the worker count, so
the stream never depends on it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

K = TypeVar("K")
T = TypeVar("T")


def prefetch_map(
    fn: Callable[[K], T], keys: Iterable[K], num_workers: int, depth: int
) -> Iterator[T]:
    """Yield fn(k) for each k in order, computed by `num_workers` threads up to `depth` ahead.

    With num_workers == 0 everything runs in the caller's thread.
    """
    if num_workers <= 0:
        for k in keys:
            yield fn(k)
        return
    keys = iter(keys)
    pending: deque[Future[T]] = deque()
    pool = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="shardrec-loader")
    try:
        for k in keys:
            pending.append(pool.submit(fn, k))
            if len(pending) >= max(depth, 1):
                break
        while pending:
            result = pending.popleft().result()
            for k in keys:
                pending.append(pool.submit(fn, k))
                break
            yield result
    finally:
        # The consumer may stop early (break, exception): drop what is queued, do not wait.
        for f in pending:
            f.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
