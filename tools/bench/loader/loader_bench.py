"""`shardrec bench loader`: rows/s delivered as torchrec Batches, against same-run baselines.

What is measured, on one thread (torch.set_num_threads(1), no prefetch workers), with every
file in the page cache, global batch 8192, world size 1:

- shardrec's loader on one-hot Criteo-shaped data (13 dense, 26 sparse with the Kaggle
  cardinalities, label), shuffle on (the default) and off, and shuffle on with its numpy
  gathers instead of the compiled kernels (`compiled=False`: the same batches; the kernels'
  same-run baseline), all on one part; and shuffle on and off on the same rows split into
  `--parts N` parts, as real datasets are (default 120: the parts of a 1/100 Criteo-1TB-shaped
  dataset at preprocess's default 128 MiB chunk: 24 days of ~541 MB of text, 5 parts each);
- the roofline: this machine's memory-copy speed (large np.copyto) divided by the bytes the
  loader reads per row;
- torchrec's InMemoryBinaryCriteoIterDataPipe on the same rows in torchrec's npy layout:
  shuffle_batches on and off (its load into RAM is timed apart; shuffle_batches only permutes
  rows inside each batch of consecutive file rows), and its real global shuffle,
  shuffle_training_set=True: one permutation of the whole training set, materialised in RAM
  when the pipe is built (the same order every epoch), then read in order. Its rows/s are
  reported for the reads alone (its shuffle untimed: not like for like with a shuffled epoch of
  ours) and for an epoch that pays the shuffle once (its build, timed once, added to each
  round's reads: the like-for-like ratio).

Each configuration runs once untimed (its warm-up, which also sizes its runs to about RUN_S seconds;
stream_runs.py), then once per round over `rounds` interleaved rounds (tools/bench/rounds.py): each
ratio is the median of the same-round ratios with its spread, per wall and per CPU-second. Fewer
than MIN_ROWS rows fit in the CPU's caches and print "too small to measure". Also reported:
anonymous (non file-backed) memory growth over the shardrec epoch, which must stay flat however
large the dataset, and the shuffle quality of the default order on labels that drift along the file.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.dataloader.format import torchrec_npy as npy
from shardrec.tools.bench.loader.criteo_rows import warm_page_cache, write_bench_data
from shardrec.tools.bench.loader.stream_runs import MIN_ROWS, measure_rounds, run_lengths
from shardrec.tools.bench.rounds import (
    Ratio,
    Run,
    goal_text,
    load_average,
    ratio,
    ratio_text,
    summarize,
)
from shardrec.tools.console import console

GOAL = 2.0
"""Shuffled shardrec against torchrec shuffled, per wall second (README: `bench loader`)."""
GOAL_RATIO = "shardrec_vs_torchrec_shuffle"
DEFAULT_PARTS = 120
"""Parts of a 1/100 Criteo-1TB-shaped dataset at preprocess's default chunk (24 days x 5)."""


def memcpy_gbps(nbytes: int = 1 << 28, repeats: int = 5) -> float:
    """Best large-copy speed in GB/s (bytes copied per second)."""
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def _drift_quality(rows: int, global_batch: int) -> dict[str, float]:
    """Shuffle quality of the default order on labels whose rate drifts along the file."""
    from shardrec.dataloader.order import OrderSpec, shuffle_quality

    rng = np.random.default_rng(1)
    # 24 "hours" of a click rate swinging between 0.15 and 0.35, as Criteo's drifts with time.
    rate = 0.25 + 0.1 * np.sin(np.arange(rows) / rows * 2 * np.pi * 24)
    labels = (rng.random(rows) < rate).astype(np.uint8)
    return shuffle_quality(labels, OrderSpec((rows,), global_batch))


def _resume_seconds(directory: Path, global_batch: int) -> dict[str, float]:
    """Time to continue a stream: at 2 ranks from a 1-rank state near the end of the epoch, and
    the order's set-up deep into a Criteo-1TB-sized epoch (4.2 B rows, no data needed)."""
    from shardrec.dataloader.loader import build_loader
    from shardrec.dataloader.order import EpochOrder, OrderSpec

    first = build_loader(directory, "train", global_batch_size=global_batch, rank=0, world_size=1)
    state = {**first.state_dict(), "sample_offset": (len(first) - 1) * global_batch}
    start = time.perf_counter()
    resumed = build_loader(directory, "train", global_batch_size=global_batch, rank=1, world_size=2)
    resumed.load_state_dict(state)
    next(iter(resumed))
    loader_s = time.perf_counter() - start
    start = time.perf_counter()
    days = (4_200_000_000 // 23,) * 23
    EpochOrder(OrderSpec(days, global_batch), 3).rows(3_000_000_000, 3_000_000_000 + global_batch)
    return {
        "resume_other_world_size_s": round(loader_s, 3),
        "order_deep_in_4_2b_rows_s": round(time.perf_counter() - start, 3),
    }


# (ratio name, ours, baseline): each a median of same-round ratios.
RATIOS = (
    ("shardrec_vs_torchrec_shuffle", "shardrec_shuffle", "torchrec_shuffle"),
    ("shardrec_vs_torchrec_no_shuffle", "shardrec_no_shuffle", "torchrec_no_shuffle"),
    # Its reads alone: the shuffle was done, untimed, when the pipe was built.
    ("shardrec_vs_torchrec_global_shuffle_reads", "shardrec_shuffle", "torchrec_global_shuffle"),
    ("shardrec_vs_torchrec_global_shuffle_epoch", "shardrec_shuffle", "torchrec_global_epoch"),
    ("shardrec_many_parts_vs_torchrec_shuffle", "shardrec_shuffle_many_parts", "torchrec_shuffle"),
    ("many_parts_vs_one_part_shuffle", "shardrec_shuffle_many_parts", "shardrec_shuffle"),
    ("many_parts_vs_one_part_no_shuffle", "shardrec_no_shuffle_many_parts", "shardrec_no_shuffle"),
    ("shardrec_compiled_vs_numpy_shuffle", "shardrec_shuffle", "shardrec_shuffle_numpy"),
    ("shardrec_shuffle_vs_torchrec_no_shuffle", "shardrec_shuffle", "torchrec_no_shuffle"),
)


def loader_ratios(runs: dict[str, list[Run]], too_small: str) -> dict[str, Ratio]:
    return {name: ratio(runs[a], runs[b], too_small=too_small) for name, a, b in RATIOS}


def _torchrec_pipes(
    theirs: Path, global_batch: int
) -> tuple[dict[str, Any], float, tuple[float, float]]:
    """torchrec's pipes over the day in `theirs`: shuffle_batches on/off and the global shuffle;
    the seconds a plain load into RAM takes, and the wall and CPU seconds of the global
    shuffle's build."""
    from torchrec.datasets.criteo import InMemoryBinaryCriteoIterDataPipe

    paths = [[str(npy.day_file(theirs, 0, k))] for k in ("dense", "sparse", "labels")]
    start = time.perf_counter()
    pipes = {
        f"torchrec_{'shuffle' if s else 'no_shuffle'}": InMemoryBinaryCriteoIterDataPipe(
            "train", *paths, global_batch, 0, 1, shuffle_batches=s
        )
        for s in (True, False)
    }
    load_s = (time.perf_counter() - start) / 2
    start, cpu = time.perf_counter(), time.process_time()
    pipes["torchrec_global_shuffle"] = InMemoryBinaryCriteoIterDataPipe(
        "train",
        *paths,
        global_batch,
        0,
        1,
        shuffle_training_set=True,
        shuffle_training_set_random_seed=0,
    )
    return pipes, load_s, (time.perf_counter() - start, time.process_time() - cpu)


def run_bench(
    rows: int,
    global_batch: int,
    rounds: int,
    max_batches: int,
    work_dir: Path | None,
    parts: int = DEFAULT_PARTS,
) -> dict[str, Any]:
    import torch

    from shardrec.dataloader.loader import Delivery, ShuffleSpec, build_loader

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="shardrec-bench-loader-", dir=work_dir))
    try:
        with console.status(
            f"writing {rows:,} Criteo-shaped rows: 1 part, {parts} parts and torchrec's layout"
        ):
            one, theirs = write_bench_data(tmp, rows)
            many, _ = write_bench_data(tmp, rows, parts=parts, name="shardrec-parts")
            warm_page_cache(tmp)
        bytes_per_row = sum(p.stat().st_size for p in one.rglob("*.arrow")) / rows
        gbps = memcpy_gbps()
        pipes, torchrec_load_s, global_shuffle = _torchrec_pipes(theirs, global_batch)

        def loader(directory: Path, shuffle: bool = True, compiled: bool | None = None):
            return build_loader(
                directory,
                "train",
                global_batch_size=global_batch,
                rank=0,
                world_size=1,
                shuffle=ShuffleSpec(enabled=shuffle),
                delivery=Delivery(compiled=compiled),
            )

        loaders = {
            "shardrec_shuffle": loader(one),
            "shardrec_shuffle_many_parts": loader(many),
            "shardrec_shuffle_numpy": loader(one, compiled=False),
            "shardrec_no_shuffle": loader(one, shuffle=False),
            "shardrec_no_shuffle_many_parts": loader(many, shuffle=False),
            **pipes,
        }
        with console.status(f"{rounds} interleaved rounds of {len(loaders)} configurations"):
            lengths = run_lengths(loaders, max_batches)
            runs, anon_growth = measure_rounds(
                loaders, lengths, rounds, watch="shardrec_shuffle_many_parts"
            )
        quality = _drift_quality(rows, global_batch)
        resume = _resume_seconds(many, global_batch)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report = _report(
        rows, parts, global_batch, rounds, bytes_per_row, gbps, runs, lengths, global_shuffle
    )
    return report | {
        "torchrec_load_into_ram_s": round(torchrec_load_s, 4),
        "shardrec_anon_memory_growth_mb": round(anon_growth / 1024, 1),
        "resume": resume,
        "shuffle_quality_drifting_labels": {k: round(v, 5) for k, v in quality.items()},
    }


def _global_shuffle_epochs(
    rows: int, global_batch: int, build: tuple[float, float], reads: list[Run]
) -> list[Run]:
    """Per round, an epoch of torchrec's global shuffle: its one shuffle into RAM (`build`: wall
    and CPU seconds, timed once), then the epoch's rows read in order at that round's rate."""
    epoch_rows = rows // global_batch * global_batch
    return [
        Run(
            epoch_rows,
            build[0] + epoch_rows * r.wall_s / r.work,
            build[1] + epoch_rows * r.cpu_s / r.work,
        )
        for r in reads
    ]


def _report(
    rows: int,
    parts: int,
    global_batch: int,
    rounds: int,
    bytes_per_row: float,
    gbps: float,
    runs: dict[str, list[Run]],
    lengths: dict[str, int],
    global_shuffle_build: tuple[float, float],
) -> dict[str, Any]:
    """The report of the timed runs; `global_shuffle_build`: the wall and CPU seconds of torchrec's
    global shuffle at its pipe's build."""
    too_small = (
        f"{rows:,} rows fit in the CPU's caches; use --rows >= {MIN_ROWS:,}"
        if rows < MIN_ROWS
        else ""
    )
    epochs = _global_shuffle_epochs(
        rows, global_batch, global_shuffle_build, runs["torchrec_global_shuffle"]
    )
    summaries = {k: summarize(v) for k, v in runs.items()}
    ratios = {
        k: v.to_dict()
        for k, v in loader_ratios({**runs, "torchrec_global_epoch": epochs}, too_small).items()
    }
    goal = ratios[GOAL_RATIO].get("median")
    roofline = gbps * 1e9 / bytes_per_row
    fraction: dict[str, Any] = {
        k: round(summaries[k].rate / roofline, 3)
        for k in ("shardrec_shuffle", "shardrec_no_shuffle")
    }
    return {
        "rows": rows,
        "parts": parts,
        "global_batch": global_batch,
        "threads": 1,
        "rounds": rounds,
        "batches_per_run": lengths,
        "load_average": load_average(),
        "bytes_per_row": round(bytes_per_row, 1),
        "memcpy_gb_per_s": round(gbps, 2),
        "roofline_rows_per_s": round(roofline),
        "rows_per_s": {k: round(v.rate) for k, v in summaries.items()},
        "rows_per_cpu_s": {k: round(v.cpu_rate) for k, v in summaries.items()},
        "runs": {k: v.to_dict() for k, v in summaries.items()},
        "ratios": ratios,
        "goals": {f"{GOAL_RATIO}_{GOAL:g}x": None if goal is None else goal >= GOAL},
        "torchrec_global_shuffle_build_s": round(global_shuffle_build[0], 4),
        "torchrec_global_shuffle_epoch_rows_per_s": round(summarize(epochs).rate),
        # Like a ratio, a share of the roofline from rows that fit in the caches measures them.
        "fraction_of_roofline": {"too_small": too_small} if too_small else fraction,
    }


RATIO_LABELS = {
    "shardrec_vs_torchrec_global_shuffle_reads": "shardrec vs torchrec global shuffle's in-order "
    "reads, its shuffle untimed",
    "shardrec_vs_torchrec_global_shuffle_epoch": "shardrec vs torchrec global shuffle's epoch, "
    "its shuffle timed",
}
"""What a ratio compares, where its name does not say it."""
ROW_LABELS = {
    "torchrec_global_shuffle": "torchrec global shuffle, in-order reads (shuffle untimed)"
}


def print_result(r: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(
        title=(
            f"loader, {r['rows']:,} rows in 1 part and in {r['parts']} parts, global batch "
            f"{r['global_batch']}, 1 thread, median of {r['rounds']} interleaved rounds "
            f"(load average {r['load_average'][0]})"
        )
    )
    for column in ("configuration", "M rows/s", "lowest-highest", "M rows/CPU-s", "run s"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for name, s in r["runs"].items():
        table.add_row(
            ROW_LABELS.get(name, name.replace("_", " ")),
            f"{s['rate'] / 1e6:.2f}",
            f"{s['low'] / 1e6:.2f}-{s['high'] / 1e6:.2f}",
            f"{s['cpu_rate'] / 1e6:.2f}",
            f"{s['run_s']:.2f}",
        )
    table.add_row(
        "torchrec global shuffle, epoch with its shuffle",
        f"{r['torchrec_global_shuffle_epoch_rows_per_s'] / 1e6:.2f}",
    )
    table.add_row("roofline (memcpy / bytes per row)", f"{r['roofline_rows_per_s'] / 1e6:.2f}")
    console.print(table)
    for name, value in r["ratios"].items():
        label = RATIO_LABELS.get(name, name.replace("_", " "))
        console.print(f"{label}: {ratio_text(value)}", highlight=False)
    for name, met in r["goals"].items():
        console.print(f"goal {name}: {goal_text(met, r['ratios'][GOAL_RATIO])}", highlight=False)
    q, resume = r["shuffle_quality_drifting_labels"], r["resume"]
    roof = r["fraction_of_roofline"]
    if "too_small" in roof:
        roof_text = f"too small to measure ({roof['too_small']})"
    else:
        roof_text = f"shuffle {roof['shardrec_shuffle']}, no shuffle {roof['shardrec_no_shuffle']}"
    console.print(
        f"fraction of the roofline: {roof_text}; "
        f"memcpy {r['memcpy_gb_per_s']} GB/s, {r['bytes_per_row']} bytes/row; "
        f"torchrec load into RAM {r['torchrec_load_into_ram_s']} s, "
        f"global shuffle into RAM {r['torchrec_global_shuffle_build_s']} s; "
        f"anon memory growth over the epoch {r['shardrec_anon_memory_growth_mb']} MB; "
        "shuffle quality (batch label-mean std vs "
        f"full permutation): {q['ratio']:.3f} (file order "
        f"{q['file_order_std'] / q['full_permutation_std']:.1f}); "
        f"resume at another world size {resume['resume_other_world_size_s']} s; order set-up "
        f"deep in a 4.2 B-row epoch {resume['order_deep_in_4_2b_rows_s']} s"
    )
