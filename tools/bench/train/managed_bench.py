"""`shardrec bench train --managed`: training samples/s with managed tables against the same model
with static tables of the same rows.

Both sides are `shardrec train`'s path on a rank (tools/bench/train/train_ranks.py: build_job, the
real loader from disk, train_segment), on data drawn once: the same Zipf-like values per table,
written as table rows for the static side (`--max-ids` style: the value folded into the table)
and as raw 64-bit ids for the managed side, whose 26 tables of `rows - 2` slots admit after 2
sightings, evict by LRU and update every 50 steps. The ids drift: every COHORT_STEPS steps a
cohort of COHORT_IDS new ids is born, and NEW_SHARE of the lookups go to the COHORT_LIFE newest
cohorts; no row is read twice (the train split holds every step of the run). So the maps fill
and the later updates evict and reset rows, as a log that never stops bringing ids does; the
tables have 1/ROWS_DIVISOR of the model's rows for that (both sides). The managed side pays for
the remap of every id, the statistics, the updates (one collective each) and the resets of
reassigned rows. The ratio is the median over interleaved rounds of managed / static samples/s
timed in the same round (load from other processes drifts over seconds).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.tools.bench.rounds import Run, ratio, ratio_text, summarize
from shardrec.tools.bench.train.train_bench import (
    MODELS,
    NUM_DENSE,
    NUM_TABLES,
    job_configs,
    launch_ranks,
    too_small,
)
from shardrec.tools.console import console

TARGET = 0.85
ZIPF_A = 1.2
EVICT_EVERY = 50
NEW_SHARE = 0.3
COHORT_IDS = 2048
COHORT_STEPS = 25
COHORT_LIFE = 6
ROWS_DIVISOR = 5
"""Steps between the maps' updates: a day of Criteo at a global batch of 64K is ~3,000 steps, and
the tables' default cadence updates 50 times a day, every ~60 steps."""


def _draw_ids(rng: np.random.Generator, n: int, first_step: int, batch: int) -> np.ndarray:
    """`n` rows' ids of one table: Zipf-like, NEW_SHARE of them from one of the COHORT_LIFE
    cohorts of new ids born last (the cohort's number in the high bits, so no two share an id)."""
    values = rng.zipf(ZIPF_A, n).astype(np.uint64)
    new = np.flatnonzero(rng.random(n) < NEW_SHARE)
    born = (first_step + new // batch) // COHORT_STEPS
    cohort = (born - rng.integers(0, COHORT_LIFE, len(new)) + COHORT_LIFE).astype(np.uint64)
    values[new] = (cohort << np.uint64(40)) | rng.integers(0, COHORT_IDS, len(new), np.uint64)
    return values


def write_pair(
    directory: Path, rows: int, table_rows: int, batch: int, seed: int = 0
) -> tuple[Path, Path]:
    """The same draws as two datasets: table rows (static) and raw ids (managed); `batch`: the
    global batch (a cohort of new ids per step)."""
    from shardrec.dataloader.format.manifest import (
        PART_SUFFIX,
        Manifest,
        SparseFeature,
        SplitInfo,
        smallest_uint,
    )
    from shardrec.dataloader.format.part_file import file_layout, write_part
    from shardrec.dataloader.format.raw_ids import RAW
    from shardrec.dataloader.util.splitmix import mix64

    rng = np.random.default_rng(seed)
    dtype = smallest_uint(table_rows - 1)
    names = [f"C{i + 1}" for i in range(NUM_TABLES)]
    dense_names = [f"I{i + 1}" for i in range(NUM_DENSE)]
    static = [SparseFeature(n, table_rows, str(dtype)) for n in names]
    raw = [SparseFeature(n, 0, "uint64", ids=RAW) for n in names]
    out = []
    draws = {}
    for split, n in (("train", rows), ("val", max(1, rows // 8))):
        dense = rng.standard_normal((n, NUM_DENSE), dtype=np.float32)
        first = 0 if split == "train" else rows // batch + 1
        values = {name: _draw_ids(rng, n, first, batch) for name in names}
        logit = dense[:, 0] + sum(np.where(v % 7 == 0, 0.3, -0.05) for v in values.values())
        labels = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.uint8)
        draws[split] = (labels, dense, values)
    for kind, features in (("static", static), ("managed", raw)):
        root = directory / kind
        layout = file_layout(dense_names, "float32", features)
        splits = {}
        for split, (labels, dense, values) in draws.items():
            if kind == "static":
                sparse = {
                    k: ((v - np.uint64(1)) % np.uint64(table_rows)).astype(dtype)
                    for k, v in values.items()
                }
            else:
                sparse = {k: mix64(v) for k, v in values.items()}
            path = root / split / f"part-00000{PART_SUFFIX}"
            splits[split] = SplitInfo(
                len(labels), [write_part(path, layout, labels, dense, sparse)]
            )
        Manifest(dense_names, features, splits).save(root)
        out.append(root)
    return out[0], out[1]


def rank_main(
    root: str, out: str, model: str, steps: int, rounds: int, threads: int, evict_every: int
) -> None:
    """One rank (started by torchrun); rank 0 writes the figures to `out`."""
    import torch

    from shardrec.tools.bench.train.train_ranks import (
        build_ours,
        from_disk,
        join_loader_threads,
        run_rounds,
    )
    from shardrec.trainer.distributed.dist import init_distributed, shutdown
    from shardrec.trainer.job.config import load_job_config

    torch.set_num_threads(threads)
    env = init_distributed("cpu")
    rows = MODELS[model][0] // ROWS_DIVISOR - 2
    static = job_configs(model, str(Path(root) / "static"), env.world_size)["fp32"]
    tables = load_job_config(
        None,
        [
            f'tables.C{i + 1}={{kind="managed", rows={rows}, evict_every={evict_every}}}'
            for i in range(NUM_TABLES)
        ],
    ).tables
    managed = dataclasses.replace(
        static,
        data=dataclasses.replace(static.data, path=str(Path(root) / "managed")),
        tables=tables,
    )
    total = (rounds + 2) * steps + 2
    with tempfile.TemporaryDirectory() as run_root:
        sides = {
            "static": build_ours(static, env, Path(run_root) / "static", total),
            "managed": build_ours(managed, env, Path(run_root) / "managed", total),
        }
        samples = steps * static.train.global_batch_size
        for side in sides.values():  # warm-up: allocations, the maps' first admissions
            side.train_from_disk(steps)
            join_loader_threads()
        rates = run_rounds(
            {name: (lambda s=side: from_disk(s, steps, samples)) for name, side in sides.items()},
            rounds,
        )
        counts = sides["managed"].job.managed.stretch_figures()
        for side in sides.values():
            side.reporter.close()
    if env.is_main:
        runs = {name: [dataclasses.asdict(r) for r in side] for name, side in rates.items()}
        Path(out).write_text(json.dumps({"runs": runs, "id_maps": counts}))
    shutdown()


def run_managed_bench(
    model: str, steps: int, rounds: int, nproc: int, threads: int, evict_every: int = 0
) -> dict[str, Any]:
    """Run the ranks through torchrun on generated data; returns the summary. RuntimeError with the
    ranks' stderr when they fail."""

    global_batch = MODELS[model][4] * nproc
    table_rows = MODELS[model][0] // ROWS_DIVISOR
    with tempfile.TemporaryDirectory() as tmp:
        # Every step of the run (rank_main's warm-up, rounds and spare) reads rows of its own.
        write_pair(Path(tmp), global_batch * ((rounds + 2) * steps + 2), table_rows, global_batch)
        out = Path(tmp) / "result.json"
        evict_every = evict_every or EVICT_EVERY
        args = [tmp, str(out), model, str(steps), str(rounds), str(threads), str(evict_every)]
        launch_ranks("shardrec.tools.bench.train.managed_bench", args, nproc, threads)
        raw = json.loads(out.read_text())
    return summarise_managed(raw, model, nproc, threads, steps, evict_every)


def no_update(steps: int, rounds: int, evict_every: int) -> str:
    """Why the ratio says nothing of the maps' updates ("": it does): a timed window without one
    times the remap only. The warm-up trains steps 0 .. steps-1, round r the `steps` steps from
    (r + 1) * steps; the maps update at every multiple of `evict_every` after step 0."""
    empty = sum(
        ((r + 2) * steps - 1) // evict_every == ((r + 1) * steps - 1) // evict_every
        for r in range(rounds)
    )
    if not empty:
        return ""
    return (
        f"{empty} of {rounds} timed windows of {steps} steps hold no update of the maps, every "
        f"{evict_every} steps: give --steps {evict_every} or more"
    )


def summarise_managed(
    raw: dict[str, Any], model: str, nproc: int, threads: int, steps: int, evict_every: int
) -> dict[str, Any]:
    """The report of rank 0's figures (its runs per side, in round order, and the maps' counts):
    managed / static as the median of same-round ratios, with its spread ("too small to measure"
    where a window is under MIN_STEPS steps or holds no update of the maps)."""
    runs = {name: [Run(**r) for r in side] for name, side in raw["runs"].items()}
    rounds = len(runs["managed"])
    small = too_small(steps) or no_update(steps, rounds, evict_every)
    vs = ratio(runs["managed"], runs["static"], too_small=small)
    return {
        "model": model,
        "ranks": nproc,
        "threads_per_rank": threads,
        "samples_per_rank": MODELS[model][4],
        "table_rows": MODELS[model][0] // ROWS_DIVISOR,
        "steps": steps,
        "rounds": rounds,
        "evict_every": evict_every,
        "median_samples_per_s": {k: round(summarize(v).rate, 1) for k, v in runs.items()},
        "managed_vs_static": vs.to_dict(),
        "target": TARGET,
        "id_maps": raw["id_maps"],
    }


def print_managed(result: dict[str, Any]) -> None:
    console.print(
        f"{result['ranks']} CPU ranks x {result['threads_per_rank']} thread(s), {result['model']} DLRM, "
        f"26 tables of {result['table_rows']:,} rows, {result['samples_per_rank']} samples per "
        f"rank, {result['rounds']} interleaved rounds x {result['steps']} steps, the maps "
        f"updated every {result['evict_every']} steps"
    )
    for name, rate in result["median_samples_per_s"].items():
        console.print(f"  {name:10s} {rate:>10,.0f} samples/s")
    maps = result["id_maps"]
    console.print(
        f"managed / static tables of the same rows: {ratio_text(result['managed_vs_static'])} "
        f"(target >= {TARGET}); the maps admitted {maps['admitted']:,} ids, evicted "
        f"{maps['evicted']:,}; {maps['shared_row_share']:.1%} of lookups on the shared row"
    )


if __name__ == "__main__":
    import sys

    rank_main(sys.argv[1], sys.argv[2], sys.argv[3], *(int(a) for a in sys.argv[4:8]))
