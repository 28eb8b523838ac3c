"""The stream stage of `shardrec bench scale`: every train part through the loader, as training
reads it.

`ranks` processes run at once, each rank r of `ranks` with the training's global batch and
shuffle (the same loader the trainer builds), so the disk, the page cache and the cores are
shared as in a training run. Each rank reports its loop's wall time, the CPU time of its
process over the loop (all threads) and its page faults: major faults are reads that waited
for the disk, minor ones pages that were in the page cache but not yet mapped. Wall minus CPU is
the time the loop waited (for the disk, or for a core on a loaded machine: `uptime` tells which).

The baseline, in the same run and the same processes, is `shardrec bench loader`'s one-part
measure: its Criteo-shaped rows (bench/loader.py's writer) in one part, read once so every page
is cached, through a loader of the same global batch, shuffle and rank; one untimed epoch maps
its pages into the process (as bench loader's interleaved rounds have), then it is timed over
as many batches as the stream yielded (epoch after epoch), so both loops are as long and the
ratio of the two rates is what the real parts cost over one warm part, not a cold start's.

The stream's first pass gives the stage's figures (rates, faults, waiting) and is the warm-up of
the ratio: after it, STREAM_ROUNDS rounds of the stream and the one part, the order alternating,
give the ratio as the rounds harness does (tools/bench/rounds.py: the median of same-round
ratios with its spread, per wall and per CPU-second, or "too small to measure").
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from shardrec.tools.bench.rounds import Ratio, Run, ratio

BASELINE_ROWS = 2_000_000
"""`bench loader`'s default rows (fewer when the stream's split is smaller)."""
STREAM_ROUNDS = 3
"""Rounds of the stream and the one warm part after the stream's first pass (the warm-up)."""


def write_baseline(directory: Path, rows: int) -> Path:
    """One part of bench loader's Criteo-shaped rows in directory/one-part, read once (page
    cache)."""
    from shardrec.tools.bench.loader.criteo_rows import warm_page_cache, write_bench_data

    ours, theirs = write_bench_data(directory, rows, parts=1, name="one-part")
    warm_page_cache(ours)
    shutil.rmtree(theirs, ignore_errors=True)  # torchrec's layout: not used here
    return ours


def _faults() -> tuple[int, int]:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_majflt, use.ru_minflt


def _loop(
    data: Path, batch: int, rank: int, ranks: int, batches: int | None = None
) -> dict[str, float]:
    """One epoch of the split (`batches` None), or: one untimed epoch, then `batches` timed ones."""
    import itertools

    from shardrec.dataloader.loader import ShuffleSpec, build_loader

    loader = build_loader(
        data,
        "train",
        global_batch_size=batch,
        rank=rank,
        world_size=ranks,
        shuffle=ShuffleSpec(enabled=True, seed=0),
    )
    if batches is not None:
        for _ in loader:  # warm: its pages mapped, its kernels compiled
            pass
        epochs = itertools.chain.from_iterable(loader for _ in itertools.count())
        stream = itertools.islice(epochs, batches)
    else:
        stream, batches = iter(loader), len(loader)
    rows, (maj0, min0) = 0, _faults()
    t0, c0 = time.perf_counter(), time.process_time()
    for b in stream:
        rows += int(b.labels.numel())
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    maj1, min1 = _faults()
    return {"rows": rows, "batches": batches, "loop_s": wall, "cpu_s": cpu,
            "major_faults": maj1 - maj0, "minor_faults": min1 - min0}  # fmt: skip


def rank_child(data: Path, baseline: Path, batch: int, rank: int, ranks: int, rounds: int) -> None:
    """In a rank's process: the stream's first pass (the stage's figures, and the rounds' warm-up),
    then `rounds` rounds of the stream and the baseline over as many batches, the order
    alternating; prints one JSON line."""
    first = _loop(data, batch, rank, ranks)
    runs: dict[str, list[dict[str, float]]] = {"stream": [], "one_part": []}
    for r in range(rounds):
        for name in ("one_part", "stream") if r % 2 == 0 else ("stream", "one_part"):
            runs[name].append(
                _loop(data, batch, rank, ranks)
                if name == "stream"
                else _loop(baseline, batch, rank, ranks, batches=int(first["batches"]))
            )
    print(json.dumps({"first": first, **runs}))


def run_ranks(
    data: Path, baseline: Path, batch: int, ranks: int, rounds: int = STREAM_ROUNDS
) -> dict[str, Any]:
    """Start `ranks` rank processes at once, wait for all; their figures, summed over ranks: the
    first pass (`first`), and each round's stream and baseline (`stream`, `one_part`: lists in
    round order)."""
    cmd = [
        sys.executable,
        "-m",
        "shardrec.tools.bench.scale.scale_stream",
        str(data),
        str(baseline),
        str(batch),
    ]
    procs = [
        subprocess.Popen(
            [*cmd, str(r), str(ranks), str(rounds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(ranks)
    ]
    outs = [p.communicate() for p in procs]
    for p, (_, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"stream rank failed: {err.strip()[-1500:]}")
    per_rank = [json.loads(out) for out, _ in outs]
    return {
        "first": combine_ranks([r["first"] for r in per_rank]),
        **{
            name: [combine_ranks([r[name][k] for r in per_rank]) for k in range(rounds)]
            for name in ("stream", "one_part")
        },
    }


def stream_ratio(measured: dict[str, Any]) -> Ratio:
    """The stream's rate over the one warm part's, through the rounds harness (run_ranks'
    rounds, all ranks together: rows over the slowest rank's loop, CPU seconds summed)."""

    def runs(name: str) -> list[Run]:
        return [Run(r["rows"], r["loop_s"], r["cpu_s"]) for r in measured[name]]

    return ratio(runs("stream"), runs("one_part"))


def combine_ranks(ranks: list[dict[str, float]]) -> dict[str, Any]:
    """All ranks together: rows summed over the slowest rank's loop (ranks run side by side)."""
    loop = max(r["loop_s"] for r in ranks)
    rows, cpu = sum(r["rows"] for r in ranks), sum(r["cpu_s"] for r in ranks)
    batches = ranks[0]["batches"]
    return {
        "rows": rows,
        "batches": batches,
        "loop_s": loop,
        "cpu_s": cpu,
        "rows_per_s": rows / max(loop, 1e-9),
        "rows_per_cpu_s": rows / max(cpu, 1e-9),
        "cpu_share": cpu / max(loop * len(ranks), 1e-9),
        "wait_s_per_rank": max(0.0, loop - cpu / len(ranks)),
        "ms_per_batch": loop / max(batches, 1) * 1e3,
        "major_faults": sum(r["major_faults"] for r in ranks),
        "minor_faults": sum(r["minor_faults"] for r in ranks),
        "per_rank": ranks,
    }


if __name__ == "__main__":
    rank_child(
        Path(sys.argv[1]),
        Path(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
        int(sys.argv[5]),
        int(sys.argv[6]),
    )
