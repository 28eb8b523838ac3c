"""Plan where every table lives: validate the inputs, search, check memory, write a PlanFile."""

from __future__ import annotations

import logging
from typing import Any

from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding.constraints import TableConstraint, parse_constraints
from shardrec.sharding.cost import PlanCost, evaluate
from shardrec.sharding.plan_io import PLAN_SCHEMA_VERSION, PlanFile, TablePlan, plan_fingerprint
from shardrec.sharding.skew import curves_from_stats
from shardrec.sharding.topology import Topology, build_topology
from shardrec.sharding.twod import add_replica_sync, group_sizes, group_topology

logger = logging.getLogger(__name__)

SEARCHES = ("shardrec", "torchrec")
# Manifest statistics that give the mean ids per sample of a feature, in order of preference.
POOLING_STAT_KEYS = ("mean_ids_per_sample", "mean_ids", "ids_per_sample_mean", "pooling_factor")


class PlanDoesNotFitError(ValueError):
    """No placement within the ranks' memory; the message gives each rank's shortfall."""


def pooling_factors(
    tables: list[EmbeddingBagConfig],
    stats: dict[str, dict[str, Any]] | None,
    constraints: dict[str, TableConstraint],
) -> dict[str, float]:
    """Mean ids per sample of each table: constraint > manifest statistics > 1 (one-hot)."""
    out = {}
    for t in tables:
        c = constraints.get(t.name)
        if c is not None and c.pooling_factors:
            out[t.name] = float(sum(c.pooling_factors))
            continue
        total = 0.0
        for f in t.feature_names:
            fs = (stats or {}).get(f, {})
            value = next((fs[k] for k in POOLING_STAT_KEYS if k in fs), 1.0)
            total += float(value)
        out[t.name] = total
    return out


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _describe_shortfall(cost: PlanCost) -> str:
    short = cost.shortfall()
    parts = [f"rank {r} needs {fmt_bytes(cost.memory_bytes[r])}, {fmt_bytes(s)} over" for r, s in sorted(short.items())[:8]]
    more = f" and {len(short) - 8} more ranks" if len(short) > 8 else ""
    return (f"the plan does not fit in {fmt_bytes(cost.memory_capacity)} per rank: " + "; ".join(parts) + more
            + " (add ranks, raise memory per rank, or allow row-wise/column-wise for the largest tables)")


def plan_tables(
    tables: list[EmbeddingBagConfig],
    *,
    world_size: int,
    local_world_size: int,
    global_batch_size: int,
    device_kind: str,
    constraints: dict[str, dict] | None = None,
    stats: dict[str, dict] | None = None,
    topology: Topology | None = None,
    compute_kernel: str = "fused",
    optimizer: str = "rowwise_adagrad",
    search: str = "shardrec",
    sharding_group_size: int = 0,
    sync_every: int = 1,
    ids_by_frequency: bool = False,
) -> PlanFile:
    """Place every table; refuse a placement that does not fit in memory.

    Args:
        constraints: table name -> ParameterConstraints fields (plus `ranks`).
        stats: feature name -> the manifest's statistics (mean ids per sample, ...).
        topology: the machines; default the cpu-gloo or h100 preset for `device_kind`.
        search: "shardrec" (ours) or "torchrec" (torchrec's EmbeddingShardingPlanner).
        sharding_group_size: 0: shard over all ranks; G: 2D, shard over groups of G ranks
            (torchrec's DMPCollection); -1: pick the fastest of all ranks and 2D group sizes.
        sync_every: 2D only: steps between the replicas' weight synchronisations.
        ids_by_frequency: ids were given hottest first (preprocess --min-count): row-wise blocks
            then get the lookups the statistics' top1/top10 shares say (skew.py).
    Raises:
        ValueError: bad constraints; PlanDoesNotFitError with the per-rank shortfall.
    """
    if search not in SEARCHES:
        raise ValueError(f"search {search!r} is not one of {', '.join(SEARCHES)}")
    if global_batch_size % world_size:
        raise ValueError(f"global batch size {global_batch_size} is not divisible by world size {world_size}")
    if sync_every <= 0:
        raise ValueError(f"sync_every = {sync_every} must be positive")
    topo = topology or build_topology("cpu-gloo" if device_kind == "cpu" else "h100", world_size, local_world_size)
    if sharding_group_size == -1:
        sizes = [0] + group_sizes(topo)
    elif sharding_group_size in (0, world_size):
        sizes = [0]
    else:
        sizes = [sharding_group_size]
    best = None
    for g in sizes:
        candidate = _plan_group(tables, topo, g, global_batch_size, constraints, stats, compute_kernel,
                                optimizer, search, sync_every, curves_from_stats(tables, stats, ids_by_frequency))
        if best is None or candidate[1].max_step_s < best[1].max_step_s:
            best = candidate
    placed, cost, g = best
    if cost.shortfall():
        raise PlanDoesNotFitError(_describe_shortfall(cost))
    plan = build_plan_file(placed, tables, topo, global_batch_size, cost, search)
    plan.sharding_group_size = g
    if g:
        plan.estimate["sync_every"] = sync_every
    return plan


def _plan_group(tables, topo, g, batch, constraints, stats, kernel, optimizer, search, sync_every, curves):
    """(placement, cost, group size) for sharding over all ranks (g = 0) or 2D groups of g."""
    group = group_topology(topo, g) if g else topo
    group_batch = batch * group.world_size // topo.world_size
    parsed = parse_constraints(constraints, tables, group.world_size)
    pooling = pooling_factors(tables, stats, parsed)
    if search == "torchrec":
        from shardrec.sharding.torchrec_planner import torchrec_plan

        placed = torchrec_plan(tables, group, group_batch, parsed, pooling, kernel)
    else:
        from shardrec.sharding.search import search_plan

        placed = search_plan(tables, group, group_batch, parsed, pooling, kernel, optimizer, curves=curves)
    cost = evaluate(placed, tables, pooling, group, group_batch, optimizer, curves)
    if g:
        cost = add_replica_sync(cost, topo, g, sync_every)
    return placed, cost, g


def build_plan_file(
    placed: list[TablePlan], tables: list[EmbeddingBagConfig], topo: Topology,
    global_batch_size: int, cost: PlanCost, search: str,
) -> PlanFile:
    return PlanFile(
        schema_version=PLAN_SCHEMA_VERSION,
        fingerprint=plan_fingerprint(tables, topo.world_size, global_batch_size, topo.device_kind),
        tables=placed,
        planner=search,
        topology=topo.to_dict(),
        estimate=cost.to_dict(),
    )
