"""Where a preprocess run's CPU goes: CPU-seconds per stage, from timers around the stages.

Each thread charges its own CPU time (time.thread_time, not wall time) to the stage it is in; a
stage entered inside another pauses the outer one, so nothing is counted twice and the stages of
all threads sum to at most the process's CPU time. `start-up/imports` is a process's CPU before
its first stage (interpreter, imports, the CLI) plus loading the compiled kernels. Pool workers
send what they measured back with each task's result (take, add). What no timer covers is the
rest: the benchmark shows it as the process tree's CPU minus the stages.
"""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

STARTUP = "start-up/imports"
PLAN = "plan (line count)"
READ = "read/newline split"
PARSE = "parse kernel"
IDS = "id hashing/mapping"
DENSE = "dense transform"
APPEND = "column appends/copies"
WRITE = "part write + checksum"
SYNC = "fsync + task markers"
COUNT = "vocabulary counting"
MERGE = "vocabulary merge"
STATS = "stats + manifest"
STAGES = (STARTUP, PLAN, READ, PARSE, IDS, DENSE, APPEND, WRITE, SYNC, COUNT, MERGE, STATS)

_LOCK = threading.Lock()
_TOTALS: dict[str, float] = {}
_LOCAL = threading.local()  # .current: [stage, thread CPU time when it was entered or resumed]
_STARTED: list[bool] = []


def _charge(name: str, seconds: float) -> None:
    with _LOCK:
        _TOTALS[name] = _TOTALS.get(name, 0.0) + seconds


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Charge the calling thread's CPU time inside the block to `name` (an outer stage pauses)."""
    outer = getattr(_LOCAL, "current", None)
    now = time.thread_time()
    if outer is not None:
        _charge(outer[0], now - outer[1])
    mine = _LOCAL.current = [name, now]
    try:
        yield
    finally:
        now = time.thread_time()
        _charge(name, now - mine[1])
        if outer is not None:
            outer[1] = now
        _LOCAL.current = outer


def process_started(warm_up=None) -> None:
    """Once per process, before its first stage: charge its CPU so far to start-up, and the
    call `warm_up` (loading compiled kernels from numba's cache) too."""
    if _STARTED:
        return
    _STARTED.append(True)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _charge(STARTUP, usage.ru_utime + usage.ru_stime)
    if warm_up is not None:
        with stage(STARTUP):
            warm_up()


def take() -> dict[str, float]:
    """What this process measured since the last take, and forget it (a worker's, sent back)."""
    with _LOCK:
        out = dict(_TOTALS)
        _TOTALS.clear()
    return out


def add(measured: dict[str, float]) -> None:
    """Another process's stages (a pool worker's), counted as this run's."""
    for name, seconds in measured.items():
        _charge(name, seconds)


def totals() -> dict[str, float]:
    """CPU-seconds per stage so far, in STAGES order, stages never entered left out."""
    with _LOCK:
        return {s: round(_TOTALS[s], 3) for s in STAGES if s in _TOTALS}
