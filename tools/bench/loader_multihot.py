"""`shardrec bench loader --multihot`: multi-hot ids made on the fly against the one-hot loader.

On bench loader's Criteo-shaped rows (one part, in the page cache), global batch and world size 1
(so samples/s are per rank), in the same run: the one-hot loader, and the loader with
`build_loader(multihot=...)` expanding every sample to DLRMv2's 26 pooling sizes (214 ids per
sample) through index tables of each `--table-rows` size, with 0 and 2 prefetch threads (each
configuration interleaved over `rounds`, the best round counts). At MLPerf's table sizes every
lookup misses the CPU caches, so the table rows matter: 1 M rows is ~0.86 GB of index tables,
10 M ~8.6 GB (drawn once into the multi-hot cache directory, then reused).

The goal a rate is held against is one H200's MLPerf DLRMv2 training rate, ~1.8 M samples/s
(HugeCTR's MLPerf v5.1 run): a rank's loader must deliver at least that.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from shardrec.tools.cli.common import console

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
    """Samples/s per rank of the one-hot loader and of on-the-fly multi-hot at each table size and worker count."""
    from shardrec.dataloader.loader import Delivery, build_loader
    from shardrec.dataloader.multihot import MultiHotOption
    from shardrec.sharding.suites import DLRMV2_POOLING
    from shardrec.tools.bench.loader import rows_per_second, warm_page_cache, write_bench_data

    tmp = Path(tempfile.mkdtemp(prefix="shardrec-bench-mh-", dir=work_dir))
    try:
        data, theirs = write_bench_data(tmp, rows, parts=1)
        shutil.rmtree(theirs)
        warm_page_cache(data)

        def loader(multihot: MultiHotOption | None = None, workers: int = 0):
            return build_loader(data, "train", global_batch_size=global_batch, rank=0, world_size=1,
                                delivery=Delivery(num_workers=workers), multihot=multihot)  # fmt: skip

        runs = {"one_hot": loader()}
        for n in table_rows:
            option = MultiHotOption(sizes=DLRMV2_POOLING, rows=(n,) * len(DLRMV2_POOLING), cache_dir=cache_dir)
            for w in WORKERS:
                runs[f"multihot_{n}_rows_{w}_workers"] = loader(option, w)
        for ld in runs.values():  # the first batches compile the gather kernels: not timed
            rows_per_second(ld, 2)
        best = {name: 0.0 for name in runs}
        for _ in range(rounds):
            for name, ld in runs.items():
                best[name] = max(best[name], rows_per_second(ld, max_batches))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "rows": rows,
        "global_batch": global_batch,
        "ids_per_sample": sum(DLRMV2_POOLING),
        "table_rows": table_rows,
        "samples_per_s_per_rank": {k: round(v, 1) for k, v in best.items()},
        "vs_one_hot": {k: round(v / best["one_hot"], 3) for k, v in best.items() if k != "one_hot"},
        "vs_gpu_rate": {k: round(v / GPU_SAMPLES_PER_S, 3) for k, v in best.items()},
    }


def print_result(r: dict[str, Any]) -> None:
    rates = r["samples_per_s_per_rank"]
    console.print(
        f"loader, multi-hot on the fly ({r['ids_per_sample']} ids per sample, DLRMv2's sizes), {r['rows']:,} rows, "
        f"global batch {r['global_batch']}, samples/s per rank (goal: >= {GPU_SAMPLES_PER_S / 1e6:.1f} M, one H200):",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"  {'one-hot':>36}: {rates['one_hot']:>12,.0f}", highlight=False)
    for name, ratio in r["vs_one_hot"].items():
        console.print(
            f"  {name:>36}: {rates[name]:>12,.0f}  {ratio:.3f}x one-hot, {r['vs_gpu_rate'][name]:.2f}x the GPU's rate",
            highlight=False,
            soft_wrap=True,
        )
