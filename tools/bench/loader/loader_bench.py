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
  reported for the reads alone and for an epoch that pays the shuffle once.

Each configuration runs `rounds` times, interleaved, and the best round counts: other
processes on a shared machine only ever slow a round down. Also reported: anonymous (non
file-backed) memory growth over the shardrec epoch, which must stay flat however large the
dataset, and the shuffle quality of the default order on labels that drift along the file.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.dataloader.format import torchrec_npy as npy
from shardrec.tools.console import console

KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
NUM_DENSE = 13


DEFAULT_PARTS = 120
"""Parts of a 1/100 Criteo-1TB-shaped dataset at preprocess's default chunk (24 days x 5)."""


def write_bench_data(
    directory: Path, rows: int, seed: int = 0, parts: int = 1, name: str = "shardrec"
) -> tuple[Path, Path]:
    """Write the same random Criteo-shaped rows as a shardrec dataset (`parts` parts, in
    directory/name) and in torchrec's layout (one day, in directory/torchrec)."""
    from shardrec.dataloader.format.manifest import (
        Manifest,
        SparseFeature,
        SplitInfo,
        smallest_uint,
        write_part,
    )

    rng = np.random.default_rng(seed)
    labels = (rng.random(rows) < 0.25).astype(np.uint8)
    dense = rng.random((rows, NUM_DENSE), dtype=np.float32)
    ids = np.stack([rng.integers(0, c, rows) for c in KAGGLE_CARDINALITIES], axis=1).astype(
        np.int32
    )
    names = [f"C{i + 1}" for i in range(len(KAGGLE_CARDINALITIES))]
    ours, theirs = directory / name, directory / "torchrec"
    sparse = {
        n: ids[:, i].astype(smallest_uint(c - 1))
        for i, (n, c) in enumerate(zip(names, KAGGLE_CARDINALITIES))
    }
    bounds = [rows * k // parts for k in range(parts + 1)]
    written = [
        write_part(
            ours / "train" / f"part-{k:05d}",
            labels[a:b],
            dense[a:b],
            {n: v[a:b] for n, v in sparse.items()},
            fsync=False,
        )
        for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))
    ]
    features = [
        SparseFeature(n, c, str(smallest_uint(c - 1))) for n, c in zip(names, KAGGLE_CARDINALITIES)
    ]
    Manifest(
        [f"I{i + 1}" for i in range(NUM_DENSE)], features, {"train": SplitInfo(rows, written)}
    ).save(ours)
    if npy.day_file(theirs, 0, "labels").is_file():
        return ours, theirs
    theirs.mkdir(parents=True, exist_ok=True)
    np.save(npy.day_file(theirs, 0, "dense"), dense)
    np.save(npy.day_file(theirs, 0, "sparse"), ids)
    np.save(npy.day_file(theirs, 0, "labels"), labels.astype(np.int32).reshape(-1, 1))
    return ours, theirs


def warm_page_cache(directory: Path) -> int:
    """Read every file once so the runs measure page-cache reads; returns bytes read."""
    total = 0
    for path in directory.rglob("*.npy"):
        with open(path, "rb") as f:
            while block := f.read(1 << 24):
                total += len(block)
    return total


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


def rows_per_second(batches: Iterable[Any], max_batches: int) -> float:
    rows, start = 0, time.perf_counter()
    for i, batch in enumerate(batches):
        rows += len(batch.labels)
        if i + 1 >= max_batches:
            break
    return rows / (time.perf_counter() - start)


def _anon_kb() -> int:
    """Anonymous resident memory of this process (file-backed map pages excluded)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    return -1


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


def _interleaved_best(
    runs: dict[str, Callable[[], float]], rounds: int, watch: str
) -> tuple[dict[str, float], int]:
    """Best rows/s of each run over interleaved rounds, and the anonymous-memory growth (KB)
    seen after the `watch` run."""
    best = {k: 0.0 for k in runs}
    anon_before, anon_growth = _anon_kb(), 0
    for _ in range(rounds):
        for name, run in runs.items():
            best[name] = max(best[name], run())
            if name == watch:
                anon_growth = max(anon_growth, _anon_kb() - anon_before)
    return best, anon_growth


def _ratios(
    best: dict[str, float], roofline: float, global_shuffle_epoch: float
) -> dict[str, float]:
    return {
        "shardrec_vs_torchrec_global_shuffle": round(
            best["shardrec_shuffle"] / best["torchrec_global_shuffle"], 2
        ),
        "shardrec_vs_torchrec_global_shuffle_epoch": round(
            best["shardrec_shuffle"] / global_shuffle_epoch, 2
        ),
        "many_parts_vs_one_part_shuffle": round(
            best["shardrec_shuffle_many_parts"] / best["shardrec_shuffle"], 2
        ),
        "many_parts_vs_one_part_no_shuffle": round(
            best["shardrec_no_shuffle_many_parts"] / best["shardrec_no_shuffle"], 2
        ),
        "shardrec_many_parts_vs_torchrec_shuffle": round(
            best["shardrec_shuffle_many_parts"] / best["torchrec_shuffle"], 2
        ),
        "shardrec_vs_torchrec_shuffle": round(
            best["shardrec_shuffle"] / best["torchrec_shuffle"], 2
        ),
        "shardrec_vs_torchrec_no_shuffle": round(
            best["shardrec_no_shuffle"] / best["torchrec_no_shuffle"], 2
        ),
        "shardrec_compiled_vs_numpy_shuffle": round(
            best["shardrec_shuffle"] / best["shardrec_shuffle_numpy"], 2
        ),
        "shardrec_shuffle_vs_torchrec_no_shuffle": round(
            best["shardrec_shuffle"] / best["torchrec_no_shuffle"], 2
        ),
        "shardrec_shuffle_fraction_of_roofline": round(best["shardrec_shuffle"] / roofline, 3),
        "shardrec_no_shuffle_fraction_of_roofline": round(
            best["shardrec_no_shuffle"] / roofline, 3
        ),
    }


def _torchrec_pipes(theirs: Path, global_batch: int) -> tuple[dict[str, Any], float, float]:
    """torchrec's pipes over the day in `theirs`: shuffle_batches on/off and the global shuffle;
    the seconds a plain load into RAM takes, and those the global shuffle's build takes."""
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
    start = time.perf_counter()
    pipes["torchrec_global_shuffle"] = InMemoryBinaryCriteoIterDataPipe(
        "train",
        *paths,
        global_batch,
        0,
        1,
        shuffle_training_set=True,
        shuffle_training_set_random_seed=0,
    )
    return pipes, load_s, time.perf_counter() - start


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
        bytes_per_row = sum(p.stat().st_size for p in one.rglob("*.npy")) / rows
        gbps = memcpy_gbps()
        pipes, torchrec_load_s, global_shuffle_s = _torchrec_pipes(theirs, global_batch)

        def loader(directory: Path, shuffle: bool = True, compiled: bool | None = None):
            spec = ShuffleSpec(enabled=shuffle)
            return build_loader(
                directory,
                "train",
                global_batch_size=global_batch,
                rank=0,
                world_size=1,
                shuffle=spec,
                delivery=Delivery(compiled=compiled),
            )

        loaders = {
            "shardrec_shuffle": loader(one),
            "shardrec_shuffle_many_parts": loader(many),
            "shardrec_shuffle_numpy": loader(one, compiled=False),
            "shardrec_no_shuffle": loader(one, shuffle=False),
            "shardrec_no_shuffle_many_parts": loader(many, shuffle=False),
        }
        runs: dict[str, Callable[[], float]] = {
            name: (lambda it=it: rows_per_second(it, max_batches))
            for name, it in {**loaders, **pipes}.items()
        }
        best, anon_growth = _interleaved_best(runs, rounds, watch="shardrec_shuffle_many_parts")
        quality = _drift_quality(rows, global_batch)
        resume = _resume_seconds(many, global_batch)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    roofline = gbps * 1e9 / bytes_per_row
    # An epoch of torchrec's global shuffle: its one shuffle into RAM, then the in-order reads.
    epoch_rows = rows // global_batch * global_batch
    global_shuffle_epoch = epoch_rows / (
        global_shuffle_s + epoch_rows / best["torchrec_global_shuffle"]
    )
    return {
        "rows": rows,
        "parts": parts,
        "global_batch": global_batch,
        "threads": 1,
        "bytes_per_row": round(bytes_per_row, 1),
        "memcpy_gb_per_s": round(gbps, 2),
        "roofline_rows_per_s": round(roofline),
        "rows_per_s": {k: round(v) for k, v in best.items()},
        "torchrec_global_shuffle_epoch_rows_per_s": round(global_shuffle_epoch),
        "ratios": _ratios(best, roofline, global_shuffle_epoch),
        "torchrec_load_into_ram_s": round(torchrec_load_s, 4),
        "torchrec_global_shuffle_build_s": round(global_shuffle_s, 4),
        "shardrec_anon_memory_growth_mb": round(anon_growth / 1024, 1),
        "resume": resume,
        "shuffle_quality_drifting_labels": {k: round(v, 5) for k, v in quality.items()},
        "rounds": rounds,
        "batches_per_run": max_batches,
    }


def print_result(r: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(
        title=(
            f"loader, {r['rows']:,} rows in 1 part and in {r['parts']} parts, global batch {r['global_batch']}, "
            f"1 thread (best of {r['rounds']})"
        )
    )
    table.add_column("configuration")
    table.add_column("M rows/s", justify="right")
    for name, value in r["rows_per_s"].items():
        table.add_row(name.replace("_", " "), f"{value / 1e6:.2f}")
    table.add_row(
        "torchrec global shuffle, epoch with its shuffle",
        f"{r['torchrec_global_shuffle_epoch_rows_per_s'] / 1e6:.2f}",
    )
    table.add_row("roofline (memcpy / bytes per row)", f"{r['roofline_rows_per_s'] / 1e6:.2f}")
    console.print(table)
    for name, value in r["ratios"].items():
        console.print(f"{name.replace('_', ' ')}: {value}")
    q, resume = r["shuffle_quality_drifting_labels"], r["resume"]
    console.print(
        f"memcpy {r['memcpy_gb_per_s']} GB/s, {r['bytes_per_row']} bytes/row; "
        f"torchrec load into RAM {r['torchrec_load_into_ram_s']} s, "
        f"global shuffle into RAM {r['torchrec_global_shuffle_build_s']} s; "
        f"anon memory growth over the epoch {r['shardrec_anon_memory_growth_mb']} MB; "
        "shuffle quality (batch label-mean std vs "
        f"full permutation): {q['ratio']:.3f} (file order {q['file_order_std'] / q['full_permutation_std']:.1f}); "
        f"resume at another world size {resume['resume_other_world_size_s']} s; order set-up deep in a 4.2 B-row epoch "
        f"{resume['order_deep_in_4_2b_rows_s']} s"
    )
