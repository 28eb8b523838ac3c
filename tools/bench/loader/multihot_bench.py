"""`shardrec bench loader --multihot`: multi-hot ids made on the fly against the one-hot loader.

On bench loader's Criteo-shaped rows (one part, in the page cache), global batch and world size 1
(so samples/s are per rank), in the same run: the one-hot loader, and the loader with
`build_loader(multihot=...)` expanding every sample to DLRMv2's 26 pooling sizes (214 ids per
sample) through index tables of each `--table-rows` size, with 0 and 2 prefetch threads (each
configuration warmed up untimed, then interleaved over `rounds` rounds: rates are medians, ratios
medians of same-round ratios, tools/bench/rounds.py). The tables are read once before the
runs, as the rows are: the runs time lookups in the page cache, not the disk. At MLPerf's table
sizes every lookup misses the CPU caches, so the table rows matter: 1 M rows is ~0.86 GB of index
tables, 10 M ~8.6 GB (drawn once into the multi-hot cache directory, then reused).

How the tables are mapped matters as much: a lookup that misses the TLB walks the page tables
too. A kernel that keeps the tables' page cache in large folios maps them with 2 MB pages
(Linux 6.18 on ext4 here: 82% of the 1 M-row tables' resident pages), else every row is a 4 KB
page of its own; the result gives the share of the tables' resident memory mapped with 2 MB
pages (`huge_mapped`, from /proc/self/smaps' FilePmdMapped) for each size.

Each configuration also gives its median CPU time per sample over the rounds (the process's, all
threads): unlike samples/s it means something on a loaded machine, and 2 cores at C CPU-ns a
sample can deliver at most 2e9 / C samples/s.

The goal a rate is held against is one H200's MLPerf DLRMv2 training rate, ~1.8 M samples/s
(HugeCTR's MLPerf v5.1 run): a rank's loader must deliver at least that.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from shardrec.tools.bench.rounds import load_average, ratio, ratio_text, summarize
from shardrec.tools.console import console

GPU_SAMPLES_PER_S = 1_800_000
"""One H200's MLPerf DLRMv2 training rate (HugeCTR, MLPerf v5.1): what a rank must be fed."""
WORKERS = (0, 2)


def run_multihot_bench(
    rows: int,
    global_batch: int,
    table_rows: list[int],
    rounds: int,
    max_batches: int,
    work_dir: Path | None,
    cache_dir: Path | None,
) -> dict[str, Any]:
    """Samples/s per rank of the one-hot loader and of on-the-fly multi-hot at each table size and
    worker count."""
    from shardrec.dataloader.loader import Delivery, build_loader
    from shardrec.dataloader.multihot.multihot_tables import (
        MultiHotOption,
        MultiHotSpec,
        default_cache_dir,
    )
    from shardrec.sharding.suites import DLRMV2_POOLING
    from shardrec.tools.bench.loader.criteo_rows import warm_page_cache, write_bench_data
    from shardrec.tools.bench.loader.stream_runs import MIN_ROWS, measure_rounds, run_lengths

    tmp = Path(tempfile.mkdtemp(prefix="shardrec-bench-mh-", dir=work_dir))
    try:
        data, theirs = write_bench_data(tmp, rows, parts=1)
        shutil.rmtree(theirs)
        warm_page_cache(data)

        def loader(multihot: MultiHotOption | None = None, workers: int = 0):
            return build_loader(
                data,
                "train",
                global_batch_size=global_batch,
                rank=0,
                world_size=1,
                # fmt: skip
                delivery=Delivery(num_workers=workers),
                multihot=multihot,
            )

        runs = {"one_hot": loader()}
        for n in table_rows:
            option = MultiHotOption(
                sizes=DLRMV2_POOLING, rows=(n,) * len(DLRMV2_POOLING), cache_dir=cache_dir
            )
            for w in WORKERS:
                runs[f"multihot_{n}_rows_{w}_workers"] = loader(option, w)
        cache = cache_dir if cache_dir is not None else default_cache_dir()
        keys = {n: MultiHotSpec(DLRMV2_POOLING, (n,) * len(DLRMV2_POOLING)).key for n in table_rows}
        for key in keys.values():  # tables drawn in an earlier run may have left the page cache
            warm_page_cache(Path(cache) / key)
        lengths = run_lengths(runs, max_batches)  # the warm-up: compiles the gather kernels
        measured, _ = measure_rounds(runs, lengths, rounds, watch="")
        huge = {
            str(n): huge_mapped_share(Path(cache) / key) for n, key in keys.items()
        }  # while still mapped
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    small = (
        f"{rows:,} rows fit in the CPU's caches; use --rows >= {MIN_ROWS:,}"
        if rows < MIN_ROWS
        else ""
    )
    summaries = {k: summarize(v) for k, v in measured.items()}
    return {
        "rows": rows,
        "global_batch": global_batch,
        "rounds": rounds,
        "load_average": load_average(),
        "ids_per_sample": sum(DLRMV2_POOLING),
        "table_rows": table_rows,
        "samples_per_s_per_rank": {k: round(v.rate, 1) for k, v in summaries.items()},
        "runs": {k: v.to_dict() for k, v in summaries.items()},
        "vs_one_hot": {
            k: ratio(v, measured["one_hot"], too_small=small).to_dict()
            for k, v in measured.items()
            if k != "one_hot"
        },
        "vs_gpu_rate": {k: round(v.rate / GPU_SAMPLES_PER_S, 3) for k, v in summaries.items()},
        # Every thread of the process: the prefetch workers' share too.
        "cpu_ns_per_sample": {k: round(1e9 / v.cpu_rate) for k, v in summaries.items()},
        "huge_mapped": huge,
    }


def huge_mapped_share(directory: Path) -> float | None:
    """Share of this process's resident pages of the files in `directory` mapped with 2 MB
    pages (None where /proc/self/smaps is unreadable or nothing of them is resident)."""
    rss = huge = 0
    inside = False
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return None
    prefix = f"{directory}/"
    for line in lines:
        field, _, rest = line.partition(":")
        if " " in field or "-" in field:  # a mapping's header: address range, ..., path
            inside = line.split()[-1].startswith(prefix)
        elif inside and field == "Rss":
            rss += int(rest.split()[0])
        elif inside and field == "FilePmdMapped":
            huge += int(rest.split()[0])
    return round(huge / rss, 3) if rss else None


def print_result(r: dict[str, Any]) -> None:
    rates = r["samples_per_s_per_rank"]
    console.print(
        f"loader, multi-hot on the fly ({r['ids_per_sample']} ids per sample, DLRMv2's sizes), {r['rows']:,} rows, "
        f"global batch {r['global_batch']}, median samples/s per rank over {r['rounds']} rounds (load average "
        f"{r['load_average'][0]}; goal: >= {GPU_SAMPLES_PER_S / 1e6:.1f} M, one H200):",
        highlight=False,
        soft_wrap=True,
    )
    cpu = r["cpu_ns_per_sample"]
    console.print(
        f"  {'one-hot':>36}: {rates['one_hot']:>12,.0f}  ({cpu['one_hot']:,} CPU-ns a sample)",
        highlight=False,
    )
    for name, vs in r["vs_one_hot"].items():
        console.print(
            f"  {name:>36}: {rates[name]:>12,.0f}  {r['vs_gpu_rate'][name]:.2f}x the GPU's rate "
            f"({cpu[name]:,} CPU-ns a sample); vs one-hot {ratio_text(vs)}",
            highlight=False,
            soft_wrap=True,
        )
    shares = [
        f"{int(n):,} rows {'unknown' if v is None else f'{v:.0%}'}"
        for n, v in r["huge_mapped"].items()
    ]
    console.print(
        f"index tables' resident pages mapped with 2 MB pages: {', '.join(shares)}", highlight=False
    )
