"""Plan where every table lives: validate the inputs, search, check memory, write a PlanFile."""

from __future__ import annotations

import logging
from typing import Any

from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding.constraints import TableConstraint, parse_constraints
from shardrec.sharding.cost import PlanCost, evaluate
from shardrec.sharding.plan_io import PLAN_SCHEMA_VERSION, PlanFile, TablePlan, plan_fingerprint
from shardrec.sharding.request import DatasetStatistics, SearchRequest
from shardrec.sharding.skew import curves_from_stats
from shardrec.sharding.topology import ClusterTopology, build_topology
from shardrec.sharding.twod import add_replica_sync, group_sizes, group_topology

logger = logging.getLogger(__name__)

SEARCHES = ("shardrec", "torchrec")
# The manifest statistic (tools/preprocess/stats.py writes it) that gives a feature's pooling.
POOLING_STAT_KEY = "mean_ids_per_sample"


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
            total += float(fs.get(POOLING_STAT_KEY, 1.0))
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
    statistics: DatasetStatistics = DatasetStatistics(),
    topology: ClusterTopology | None = None,
    compute_kernel: str = "fused",
    optimizer: str = "rowwise_adagrad",
    search: str = "shardrec",
    sharding_group_size: int = 0,
    sync_every: int = 1,
) -> PlanFile:
    """Place every table; refuse a placement that does not fit in memory.

    Args:
        constraints: table name -> ParameterConstraints fields (plus `ranks`).
        statistics: what the dataset says (DatasetStatistics.from_manifest): per-feature mean
            ids per sample and lookup skew, and whether ids are numbered hottest first (then
            row-wise blocks get the lookups the statistics' top1/top10 shares say, skew.py).
        topology: the machines; default the cpu-gloo or h100 preset for `device_kind`.
        search: "shardrec" (ours) or "torchrec" (torchrec's EmbeddingShardingPlanner).
        sharding_group_size: 0: shard over all ranks; G: 2D, shard over groups of G ranks
            (torchrec's DMPCollection); -1: pick the fastest of all ranks and 2D group sizes.
        sync_every: 2D only: steps between the replicas' weight synchronisations.
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
    curves = curves_from_stats(tables, statistics.stats, statistics.ids_by_frequency)
    best = None
    for g in sizes:
        request = _group_request(tables, topo, g, global_batch_size, constraints, statistics.stats,
                                 compute_kernel=compute_kernel, optimizer=optimizer, curves=curves)
        candidate = _plan_group(request, topo, g, search=search, sync_every=sync_every)
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


def _group_request(
    tables: list[EmbeddingBagConfig],
    topo: ClusterTopology,
    group_size: int,
    global_batch_size: int,
    constraints: dict[str, dict] | None,
    stats: dict[str, dict[str, Any]],
    *,
    compute_kernel: str,
    optimizer: str,
    curves: dict[str, Any],
) -> SearchRequest:
    """The problem of sharding over all ranks (group_size 0) or over one 2D group of that many."""
    group = group_topology(topo, group_size) if group_size else topo
    parsed = parse_constraints(constraints, tables, group.world_size)
    return SearchRequest(
        tables=tables,
        topology=group,
        global_batch_size=global_batch_size * group.world_size // topo.world_size,
        pooling=pooling_factors(tables, stats, parsed),
        constraints=parsed,
        compute_kernel=compute_kernel,
        optimizer=optimizer,
        curves=curves,
    )


def _plan_group(
    request: SearchRequest, topo: ClusterTopology, group_size: int, *, search: str, sync_every: int
) -> tuple[list[TablePlan], PlanCost, int]:
    """(placement, cost, group size) of one request; 2D groups add the replicas' weight sync."""
    if search == "torchrec":
        from shardrec.sharding.torchrec_planner import torchrec_plan

        placed = torchrec_plan(request)
    else:
        from shardrec.sharding.search import search_plan

        placed = search_plan(request)
    r = request
    cost = evaluate(placed, r.tables, r.pooling, r.topology, r.global_batch_size, r.optimizer, r.curves)
    if group_size:
        cost = add_replica_sync(cost, topo, group_size, sync_every)
    return placed, cost, group_size


def build_plan_file(
    placed: list[TablePlan], tables: list[EmbeddingBagConfig], topo: ClusterTopology,
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
