"""`shardrec bench hitrate`: the planner's predicted UVM cache hit rates against exact caches
replaying the dataset's own id stream.

The stream is the one training reads (tools/measure/id_stream.py: the job's train split in loader
order, global batch by global batch, on-the-fly multi-hot expanded); each cached table shard of
the plan sees its rank's share (column-wise and table-wise shards every id of the table,
row-wise shards the ids of their row block). Every shard's ids go through an exact LRU and an
exact LFU cache of the planned size (cache_sim.py), and the bench prints, per shard, the
predicted and simulated share of a batch's unique rows found in the cache and of lookups, and
the largest error in points (goal: 2). LRU's predicted unique-row rate is the plan's own;
the others are predicted from the curve of the replayed batches (sharding/cost/hit_rates.py).

Without `--plan`, it plans the job for CUDA ranks whose HBM holds `--hbm-share` of the tables
(the rest must go to host memory behind caches), with id frequencies measured on the same
batches it replays, under the job's `[sharding.constraints]` as `train` and `plan` plan it.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from shardrec.tools.console import console

GOAL_POINTS = 2.0


def _job(data: Path, config: Path | None, sets: list[str]):
    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.embeddings.tables import build_table_configs
    from shardrec.trainer.job.config import load_job_config
    from shardrec.trainer.job.data_options import model_manifest

    job = load_job_config(config, sets)
    manifest = model_manifest(Manifest.load(data), job.data)
    return job, build_table_configs(manifest, job.model.embedding_dim, job.model.dims)


def _constraints(job, configs, curves) -> dict[str, dict[str, Any]]:
    """The job's [sharding.constraints], which `train` and `plan` plan with, each table's pooling
    the one measured on the replayed batches where the job gives none (a pooling_factors it gives
    wins, as over the manifest's in `plan`)."""
    batch = job.train.global_batch_size
    out = {c.name: {"pooling_factors": [curves[c.name].lookups_per_batch / batch]} for c in configs}
    for name, given in job.sharding.constraints.items():  # an unknown table: refused by the planner
        out[name] = {**out.get(name, {}), **given}
    return out


def _plan_past_hbm(job, configs, curves, world_size: int, hbm_share: float):
    """The job planned for h100 ranks whose HBM holds `hbm_share` of the tables and their optimizer
    state, under its constraints."""
    from shardrec.sharding.cost.comms import Workload
    from shardrec.sharding.cost.cost_model import optimizer_bytes, rank_fixed_bytes
    from shardrec.sharding.machine.topology import build_topology
    from shardrec.sharding.plan.constraints import parse_constraints
    from shardrec.sharding.plan.plan_types import PlanDoesNotFitError
    from shardrec.sharding.planner import plan_tables, pooling_factors
    from shardrec.sharding.search.request import DatasetStatistics, PlanRequest

    tables = sum(
        c.num_embeddings * c.embedding_dim * 4
        + optimizer_bytes(job.optim.sparse, c.num_embeddings, c.embedding_dim)
        for c in configs
    )
    topo = build_topology("h100", world_size)
    batch = job.train.global_batch_size
    constraints = _constraints(job, configs, curves)
    pooling = pooling_factors(configs, None, parse_constraints(constraints, configs, world_size))
    # The ranks' HBM: the tables' share plus what every rank holds anyway (inputs), before the
    # reserve.
    fixed = rank_fixed_bytes(topo, Workload(batch, world_size), configs, pooling, None)
    memory = int((hbm_share * tables / world_size + fixed) / (1 - topo.reserve_fraction))
    topo = dataclasses.replace(topo, memory_bytes=memory, memory_source="user")
    request = PlanRequest(
        configs=configs,
        world_size=world_size,
        local_world_size=topo.local_world_size,
        global_batch_size=job.train.global_batch_size,
        device_kind="cuda",
        topology=topo,
        constraints=constraints,
        statistics=DatasetStatistics(frequencies=curves),
        optimizer=job.optim.sparse,
    )
    try:
        return plan_tables(request)
    except PlanDoesNotFitError as e:
        if not e.least_hbm:
            raise
        rank, need = max(e.least_hbm.items(), key=lambda kv: kv[1])
        # Per rank, usable HBM = share x tables / ranks + fixed: the share the neediest rank needs.
        share = (need - fixed) * world_size / tables
        raise ValueError(_too_small_a_share(hbm_share, topo, rank, need, share)) from None


def _too_small_a_share(hbm_share: float, topo, rank: int, need: float, share: float) -> str:
    from shardrec.sharding.plan.report import fmt_bytes

    # Rounded up: the share printed must be one that fits.
    advice = (
        f"raise --hbm-share to {math.ceil(share * 100) / 100:g} or more"
        if share < 0.99
        else "no --hbm-share under 1 leaves room for it (try another --world-size)"
    )
    return (
        f"--hbm-share {hbm_share:g} leaves each of the {topo.world_size} ranks "
        f"{fmt_bytes(topo.usable_bytes)} of HBM after the reserve, but rank {rank} needs "
        f"{fmt_bytes(need)} even with every table in host memory behind the smallest useful "
        f"cache: {advice}"
    )


def _nothing_cached(plan, hbm_share: float | None, plan_path: Path | None) -> str:
    """Why there is nothing to replay: the plan keeps no table behind an HBM cache."""
    if plan_path is not None:
        return f"{plan_path}: the plan caches no table (no fused_uvm_caching): nothing to replay"
    uncached = [t.name for t in plan.tables if t.compute_kernel == "fused_uvm"]
    if not uncached:
        return (
            f"every table fits in HBM at --hbm-share {hbm_share:g}: nothing to cache, nothing to "
            "replay; lower --hbm-share"
        )
    named = ", ".join(uncached[:-1]) + " and " + uncached[-1] if len(uncached) > 1 else uncached[0]
    return (
        f"at --hbm-share {hbm_share:g} the plan caches no table: {named} "
        f"{'stay' if len(uncached) > 1 else 'stays'} in host memory uncached (fused_uvm: no cache "
        "was worth its HBM on the ids' frequencies; evenly spread ids gain little from one), the "
        "rest in HBM: nothing to replay; skewed ids (Criteo's) get caches, or pass --plan a plan "
        "that caches a table"
    )


def replay(data: Path, job, configs, plan, curves, batches: int) -> list[dict[str, Any]]:
    """Every cached shard of `plan` through exact LRU and LFU caches of its planned size; per shard
    the predicted and simulated hit rates."""
    import numpy as np

    from shardrec.sharding.cost.hit_rates import lfu_hit_rate, lru_hit_rate
    from shardrec.tools.bench.plan.cache_sim import BatchLFU, BatchLRU
    from shardrec.tools.measure.id_stream import table_batches

    shards = [(t, i, s) for t in plan.tables if t.cache is not None for i, s in enumerate(t.shards)]
    sims = {
        (t.name, i): (BatchLRU(t.cache.rows[i], s.rows), BatchLFU(t.cache.rows[i], s.rows))
        for t, i, s in shards
    }
    totals = {key: np.zeros((2, 4)) for key in sims}
    for batch in table_batches(data, job, configs, batches):
        for t, i, s in shards:
            ids = batch[t.name]
            ids = ids[(ids >= s.row_offset) & (ids < s.row_offset + s.rows)] - s.row_offset
            lru, lfu = sims[(t.name, i)]
            totals[(t.name, i)] += (lru.step(ids), lfu.step(ids))
    rows = []
    for t, i, s in shards:
        got = totals[(t.name, i)]
        block = curves[t.name].block(s.row_offset, s.rows, False)
        lru, lfu = lru_hit_rate(block, t.cache.rows[i]), lfu_hit_rate(block, t.cache.rows[i])
        rows.append(
            {
                "table": t.name,
                "shard": i,
                "rank": s.rank,
                "rows": s.rows,
                "cache_rows": t.cache.rows[i],
                "load_factor": t.cache.load_factor,
                "lru": _pair(t.cache.hit_rates[i], lru.lookup_hit_rate, got[0]),
                "lfu": _pair(lfu.unique_hit_rate, lfu.lookup_hit_rate, got[1]),
            }
        )
    return rows


def _pair(unique: float, lookup: float, got) -> dict[str, float]:
    sim_unique = float(got[1] / got[0]) if got[0] else 0.0
    sim_lookup = float(got[3] / got[2]) if got[2] else 0.0
    return {
        "predicted_unique": unique,
        "simulated_unique": sim_unique,
        "predicted_lookup": lookup,
        "simulated_lookup": sim_lookup,
        "error_points": 100 * max(abs(unique - sim_unique), abs(lookup - sim_lookup)),
    }


def print_result(result: dict[str, Any]) -> None:
    from rich.table import Table

    t = Table(
        title=f"UVM cache hit rates: predicted / simulated on {result['batches']:,} batches of {result['data']}"
    )
    t.caption = (
        "per cached shard: share of a batch's unique rows (and of lookups) found in the cache, predicted from the "
        "id-frequency curve / simulated with an exact cache of the planned size; err: the larger gap, in points"
    )
    for col in (
        "table",
        "rank",
        "cache rows",
        "LRU unique",
        "LRU lookups",
        "err",
        "LFU unique",
        "LFU lookups",
        "err",
    ):
        t.add_column(col, justify="left" if col == "table" else "right")
    pct = lambda r, kind: f"{r[f'predicted_{kind}']:.1%} / {r[f'simulated_{kind}']:.1%}"  # noqa: E731
    for r in result["shards"]:
        lru, lfu = r["lru"], r["lfu"]
        t.add_row(
            r["table"],
            str(r["rank"]),
            f"{r['cache_rows']:,} ({r['load_factor']:.1%})",
            pct(lru, "unique"),
            pct(lru, "lookup"),
            f"{lru['error_points']:.2f}",
            pct(lfu, "unique"),
            pct(lfu, "lookup"),
            f"{lfu['error_points']:.2f}",
        )
    console.print(t)
    for model in ("lru", "lfu"):
        worst = result[f"worst_{model}_points"]
        verdict = "within" if worst <= GOAL_POINTS else "NOT within"
        shards = len(result["shards"])
        console.print(
            f"{model.upper()}: worst error {worst:.2f} points over {shards} shards ({verdict} {GOAL_POINTS:g})"
        )


def run_hitrate(
    data: Path,
    config: Path | None,
    sets: list[str],
    plan: Path | None,
    world_size: int,
    hbm_share: float,
    batches: int,
) -> dict[str, Any]:
    """Replay the data's id stream through exact LRU and LFU caches of the plan's sizes (without
    `plan`: a plan past HBM for `world_size` CUDA ranks holding `hbm_share` of the tables);
    ValueError says what is wrong."""
    from shardrec.sharding.plan.plan_file import load_plan
    from shardrec.tools.measure.id_stream import count_batches, measure_curves

    if not 0 < hbm_share < 1:
        raise ValueError(f"--hbm-share must lie in (0, 1), got {hbm_share}")
    job, configs = _job(data, config, sets)
    curves = measure_curves(data, job, configs, batches, to_epoch=False)
    if plan:
        placed = load_plan(plan)
    else:
        try:
            placed = _plan_past_hbm(job, configs, curves, world_size, hbm_share)
        except ValueError as e:  # a constraint that cannot hold: where the job file set it
            raise ValueError(job.located(str(e))) from None
    shards = replay(data, job, configs, placed, curves, batches)
    if not shards:
        raise ValueError(_nothing_cached(placed, hbm_share, plan))
    return {
        "data": str(data),
        "batches": count_batches(data, job, batches),
        "shards": shards,
        "worst_lru_points": max(s["lru"]["error_points"] for s in shards),
        "worst_lfu_points": max(s["lfu"]["error_points"] for s in shards),
        "goal_points": GOAL_POINTS,
    }
