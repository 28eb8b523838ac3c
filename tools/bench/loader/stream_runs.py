"""Timing a loader: batches streamed epoch after epoch, each configuration's runs sized by its
warm-up to last about RUN_S seconds, then run over interleaved rounds (tools/bench/rounds.py)
while the process's anonymous memory is watched."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from shardrec.tools.bench.rounds import Run, run_rounds, timed

RUN_S = 0.5
"""Wall seconds a timed run lasts (its batch count is sized by the configuration's warm-up)."""
MIN_ROWS = 1_000_000
"""Fewer rows fit in the CPU's caches: rates then measure the caches, not the loader."""
PROBE_BATCHES = 16
MAX_BATCHES = 1 << 14


def rows_per_second(batches: Iterable[Any], max_batches: int) -> float:
    """Rows/s of the first `max_batches` batches of one pass over `batches`."""
    start = time.perf_counter()
    rows = stream_rows(batches, max_batches)
    return rows / (time.perf_counter() - start)


def stream_rows(loader: Iterable[Any], batches: int) -> int:
    """Rows of `batches` batches, epoch after epoch (each epoch a fresh iterator, whose start-up
    counts as it does in training)."""
    rows, left = 0, batches
    while left > 0:
        done = 0
        for batch in loader:
            rows += len(batch.labels)
            done += 1
            if done >= left:
                break
        if done == 0:
            break
        left -= done
    return rows


def settle_warmers() -> None:
    """Wait for the threads warming a next shuffle group (group_maps.py) to finish. A timed run
    ends while its warmer may still open parts: unsettled, that CPU fell into the next run timed,
    another configuration's (up to ~4% of the many-part stream's CPU at one group a round)."""
    from shardrec.dataloader.group_maps import WARM_THREAD

    for thread in threading.enumerate():
        if thread.name == WARM_THREAD:
            thread.join()


def timed_stream(fn: Callable[[], float]) -> Run:
    """`timed(fn)` whose CPU seconds include what its warmers spend after it returns (waited
    for: settle_warmers), its wall seconds not (a steady stream overlaps them with its batches)."""
    wall, cpu = time.perf_counter(), time.process_time()
    work = fn()
    wall_s = time.perf_counter() - wall
    settle_warmers()
    return Run(float(work), wall_s, time.process_time() - cpu)


def _anon_kb() -> int:
    """Anonymous resident memory of this process (file-backed map pages excluded)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return -1


def run_lengths(loaders: dict[str, Iterable[Any]], max_batches: int) -> dict[str, int]:
    """Batches per timed run of each configuration: `max_batches` if set, else as many as last
    about RUN_S at the fastest rate of its untimed warm-up (after a first run that loads kernels
    and maps files, runs of 16, 64, ... batches until one lasts RUN_S / 4: a run's start-up, one
    gather ahead, must not set the rate; that length once more, the faster of the two counting:
    on a loaded machine a probe slowed down would make every run too short)."""
    lengths = {}
    for name, loader in loaders.items():
        stream_rows(loader, PROBE_BATCHES)  # the warm-up proper: compiled kernels, first maps
        n = PROBE_BATCHES
        while True:
            probe = timed(lambda loader=loader, n=n: stream_rows(loader, n))
            if max_batches or probe.wall_s >= RUN_S / 4 or n >= MAX_BATCHES:
                break
            n *= 4
        if not max_batches:
            again = timed(lambda loader=loader, n=n: stream_rows(loader, n))
            wall = min(probe.wall_s, again.wall_s)
        lengths[name] = max_batches or min(MAX_BATCHES, math.ceil(n * RUN_S / wall))
    return lengths


def measure_rounds(
    loaders: dict[str, Iterable[Any]], lengths: dict[str, int], rounds: int, watch: str
) -> tuple[dict[str, list[Run]], int]:
    """Each configuration's runs over interleaved rounds, and the anonymous-memory growth (KB)
    seen after the `watch` configuration's runs."""
    anon_before, growth = _anon_kb(), [0]

    def on_run(name: str, _round: int, _run: Run) -> None:
        if name == watch:
            growth[0] = max(growth[0], _anon_kb() - anon_before)

    variants = {
        name: (lambda loader=loader, n=lengths[name]: timed_stream(lambda: stream_rows(loader, n)))
        for name, loader in loaders.items()
    }
    return run_rounds(variants, rounds, warmup=False, on_run=on_run), growth[0]
