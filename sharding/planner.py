"""Plan where every table lives: validate the inputs, search, check memory, write a PlanFile.

`plan_tables(PlanRequest(...))` is the entry point (`shardrec plan`, the trainer's plan at start,
the tests); it returns TablePlans in a PlanFile, one per EmbeddingBagConfig of the request.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import replace
from typing import Any

import numpy as np
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.dataloader.format.manifest import POOLING_STAT
from shardrec.sharding.cost.cost_model import PlanCost, evaluate
from shardrec.sharding.cost.skew import LookupCurve, curves_from_stats
from shardrec.sharding.machine.topology import ClusterTopology, build_topology
from shardrec.sharding.plan.constraints import TableConstraint, parse_constraints
from shardrec.sharding.plan.plan_file import plan_fingerprint
from shardrec.sharding.plan.plan_types import (
    PLAN_SCHEMA_VERSION,
    SEQUENCE_SHARDING_TYPES,
    SHARDING_TYPES,
    PlanDoesNotFitError,
    PlanEstimate,
    PlanFile,
    TablePlan,
)
from shardrec.sharding.plan.report import fmt_bytes, idle_ranks_warning
from shardrec.sharding.search.cached_tables import (
    TableKernel,
    choose_kernels,
    kernel_hulls,
    table_budget,
)
from shardrec.sharding.search.options import Problem
from shardrec.sharding.search.request import DatasetStatistics, PlanRequest, SearchRequest
from shardrec.sharding.torchrec.twod import add_replica_sync, group_sizes, group_topology

logger = logging.getLogger(__name__)

SEARCHES = ("shardrec", "torchrec")
DEFAULT_COST_MODEL = {"cpu": "shardrec", "cuda": "shardrec"}
"""The step-time model shardrec's search optimises where no calibration profile names the better
one (`bench plan-reality --profile-out`): shardrec's own, the one today's plans were made with."""


def pooling_factors(
    configs: list[EmbeddingBagConfig],
    stats: dict[str, dict[str, Any]] | None,
    constraints: dict[str, TableConstraint],
) -> dict[str, float]:
    """Mean ids per sample of each table: constraint > manifest statistics > 1 (one-hot)."""
    out = {}
    for config in configs:
        constraint = constraints.get(config.name)
        if constraint is not None and constraint.pooling_factors:
            out[config.name] = float(sum(constraint.pooling_factors))
            continue
        total = 0.0
        for feature in config.feature_names:
            feature_stats = (stats or {}).get(feature, {})
            total += float(feature_stats.get(POOLING_STAT, 1.0))
        out[config.name] = total
    return out


def _describe_shortfall(cost: PlanCost, device_kind: str, hint: str = "") -> str:
    """Each short rank's need and gap per memory tier: HBM (CPU: memory) and host memory for UVM
    tables."""
    tier = "HBM" if device_kind == "cuda" else "memory"
    short, host_short = cost.shortfall(), cost.host_shortfall()
    host = np.broadcast_to(np.asarray(cost.host_bytes, dtype=np.float64), cost.step_s.shape)
    parts = [
        f"rank {r} needs {fmt_bytes(cost.memory_bytes[r])} of {tier}, {fmt_bytes(s)} short"
        for r, s in sorted(short.items())[:8]
    ]
    parts += [
        f"rank {r} needs {fmt_bytes(host[r])} of host memory, {fmt_bytes(s)} short"
        for r, s in sorted(host_short.items())[:8]
    ]
    more = len(short) + len(host_short) - len(parts)
    usable = f"{fmt_bytes(cost.memory_capacity)} of {tier} usable per rank"
    if cost.device_memory:
        usable += f" ({fmt_bytes(cost.device_memory)} less the reserve)"
    if host_short:
        usable += f", {fmt_bytes(cost.host_capacity)} of host memory"
    return (
        f"the plan does not fit: {usable}; "
        + "; ".join(parts)
        + (f" and {more} more" if more > 0 else "")
        + f" ({hint or 'add ranks, raise memory per rank, or allow row-wise/column-wise for the largest tables'})"
    )


def _fits_nowhere(request: SearchRequest) -> str:
    """Why no placement can fit, where one part alone is too big for a rank: what every rank holds
    besides its tables, or a table whose least-memory allowed option overflows one rank ("" when
    only the sum is too big: then the per-rank shortfall says it all)."""
    problem = Problem(request)
    usable, left = problem.topo.usable_bytes, problem.capacity
    if left <= 0:
        # On CPU the managed tables' id maps are in it (cost_model.fixed_memory); their rows are
        # the job's to lower.
        maps = request.dense.id_map_bytes if problem.topo.device_kind != "cuda" else 0
        return (
            "what every rank holds besides its tables (dense layers, framework"
            + (f", the managed tables' id maps: {fmt_bytes(maps)}" if maps else "")
            + f") needs {fmt_bytes(usable - left)}, more than the {fmt_bytes(usable)} usable: "
            + ("lower the managed tables' rows or raise" if maps else "raise")
            + " memory per rank"
        )
    for index, options in enumerate(problem.options):
        need, least = min((problem.max_memory(index, o), o.sharding_type) for o in options)
        if need <= left:
            continue
        name, allowed = problem.configs[index].name, sorted({o.sharding_type for o in options})
        constraint = problem.cons[index]
        # Narrowed by the job (a sequence table's own types are no constraint to loosen).
        narrowed = constraint.ranks or constraint.min_partition or constraint.compute_kernels
        narrowed = narrowed or constraint.sharding_types not in (
            SHARDING_TYPES,
            SEQUENCE_SHARDING_TYPES,
        )
        config = problem.configs[index]
        numbered = request.numbered_ids
        ids = next((numbered[f] for f in config.feature_names if f in numbered), "")
        return (
            f"table {name} fits on no rank: it needs {fmt_bytes(need)} on one rank at least "
            f"({least}; allowed: {', '.join(allowed)}), a rank has {fmt_bytes(left)} for tables "
            f"after the {fmt_bytes(usable - left)} every rank holds; "
            + (
                f"its {config.num_embeddings:,} rows are a row per {ids} id up to the largest: "
                f"renumber the {ids} ids from 0 (one row each) and preprocess again, or "
                if ids
                else ""
            )
            + (
                f"loosen sharding.constraints.{name} or raise memory per rank"
                if narrowed
                else "add ranks or raise memory per rank"
            )
        )
    return ""


def _fits(cost: PlanCost) -> bool:
    return not cost.shortfall() and not cost.host_shortfall()


def _short_bytes(cost: PlanCost) -> float:
    """Bytes missing over all short ranks, memory and host memory together."""
    return float(sum(cost.shortfall().values()) + sum(cost.host_shortfall().values()))


def plan_tables(request: PlanRequest, *, search: str = "shardrec") -> PlanFile:
    """Place every table; refuse a placement that does not fit in memory.

    Args:
        request: the tables, the job's shape and the planner's options (request.py).
        search: "shardrec" (ours) or "torchrec" (torchrec's EmbeddingShardingPlanner).
    Raises:
        ValueError: bad constraints; PlanDoesNotFitError with the per-rank shortfall.
    """
    if search not in SEARCHES:
        raise ValueError(f"search {search!r} is not one of {', '.join(SEARCHES)}")
    topo = request.topology or build_topology(
        "cpu-gloo" if request.device_kind == "cpu" else "h100",
        request.world_size,
        request.local_world_size,
    )
    if request.sharding_group_size == -1:
        sizes = [0] + group_sizes(topo)
    elif request.sharding_group_size in (0, request.world_size):
        sizes = [0]
    else:
        sizes = [request.sharding_group_size]
    statistics = request.statistics
    curves = curves_from_stats(request.configs, statistics.stats, statistics.ids_by_frequency)
    best = None
    for group_size in sizes:
        search_request = _group_request(request, topo, group_size, curves)
        candidate = _plan_group(
            search_request, topo, group_size, search=search, sync_every=request.sync_every
        )
        if best is None or candidate[1].max_step_s < best[1].max_step_s:
            best = candidate
    table_plans, cost, group_size = best
    if not _fits(cost) and topo.device_kind == "cuda" and search == "shardrec" and group_size == 0:
        table_plans, cost = _plan_past_device_memory(
            _group_request(request, topo, 0, curves), statistics, cost
        )
    if not _fits(cost):
        hint = _fits_nowhere(_group_request(request, topo, group_size, curves))
        raise PlanDoesNotFitError(
            _describe_shortfall(cost, topo.device_kind, hint), short_bytes=_short_bytes(cost)
        )
    plan = build_plan_file(
        table_plans, request.configs, topo, request.global_batch_size, cost, search
    )
    # Every group size's request carries the same pooling factors (the data's, or the constraints').
    pooled = {
        name: round(factor, 4) for name, factor in search_request.pooling.items() if factor != 1.0
    }
    plan.estimate = dataclasses.replace(
        plan.estimate, ids_per_sample=pooled, dense_param_bytes=request.dense.param_bytes
    )
    if search == "shardrec":
        plan.estimate = dataclasses.replace(plan.estimate, cost_model=cost_model_of(topo))
    plan.sharding_group_size = group_size
    if group_size:
        plan.estimate = dataclasses.replace(plan.estimate, sync_every=request.sync_every)
    idle = idle_ranks_warning(plan)
    if idle:
        logger.warning("%s", idle)
    return plan


def _group_request(
    request: PlanRequest, topo: ClusterTopology, group_size: int, curves: dict[str, LookupCurve]
) -> SearchRequest:
    """The problem of sharding over all ranks (group_size 0) or over one 2D group of that many."""
    group = group_topology(topo, group_size) if group_size else topo
    parsed = parse_constraints(request.constraints, request.configs, group.world_size)
    return SearchRequest(
        configs=request.configs,
        topology=group,
        global_batch_size=request.global_batch_size * group.world_size // topo.world_size,
        pooling=pooling_factors(request.configs, request.statistics.stats, parsed),
        constraints=parsed,
        compute_kernel=request.compute_kernel,
        optimizer=request.optimizer,
        curves=curves,
        dense=request.dense,
        numbered_ids=request.statistics.numbered_ids,
    )


def _plan_group(
    request: SearchRequest, topo: ClusterTopology, group_size: int, *, search: str, sync_every: int
) -> tuple[list[TablePlan], PlanCost, int]:
    """(placement, cost, group size) of one request; 2D groups add the replicas' weight sync."""
    if search == "torchrec":
        from torchrec.distributed.planner.types import PlannerError

        from shardrec.sharding.torchrec.torchrec_planner import torchrec_plan

        try:
            table_plans = torchrec_plan(request)
        except PlannerError:  # its message: many lines of torchrec's storage figures
            raise PlanDoesNotFitError(
                "the plan does not fit: torchrec's planner found no placement within "
                f"{fmt_bytes(topo.usable_bytes)} per rank ("
                + (
                    _fits_nowhere(request)
                    or "add ranks, raise memory per rank or loosen sharding.constraints; "
                    "--search shardrec names each rank's gap"
                )
                + ")"
            ) from None
    else:
        from shardrec.sharding.search.shardrec_search import search_plan

        table_plans = search_plan(request, problem=priced_by(request, cost_model_of(topo)))
    cost = _evaluate(table_plans, request)
    if group_size:
        cost = add_replica_sync(cost, topo, group_size, sync_every)
    return table_plans, cost, group_size


def _evaluate(table_plans: list[TablePlan], request: SearchRequest) -> PlanCost:
    return evaluate(
        table_plans,
        request.configs,
        request.pooling,
        request.topology,
        request.global_batch_size,
        request.optimizer,
        request.curves,
        request.dense,
    )


def _plan_past_device_memory(
    request: SearchRequest, statistics: DatasetStatistics, cost: PlanCost
) -> tuple[list[TablePlan], PlanCost]:
    """Tables that do not fit in HBM: kernels and caches chosen from the data's id frequencies under
    a shrinking HBM budget (cached_tables.py) until the search places them within every rank's HBM
    and host memory; else the placement needing the least HBM, if it fits, or the refusal showing
    its ranks' gaps."""
    from shardrec.sharding.search.shardrec_search import search_plan

    if not statistics.frequencies:
        hint = (
            "to keep tables in host memory behind an HBM cache the planner needs the data's id frequencies, "
            "which `shardrec plan` counts"
        )
        raise PlanDoesNotFitError(
            _describe_shortfall(cost, "cuda", hint), short_bytes=_short_bytes(cost)
        )
    request = replace(
        request, frequencies=statistics.frequencies, ids_by_frequency=statistics.ids_by_frequency
    )
    hulls = kernel_hulls(
        request, statistics.frequencies, statistics.ids_by_frequency, request.constraints
    )
    budget = table_budget(request) * 0.95

    def attempt_with(kernels: dict[str, TableKernel]) -> tuple[list[TablePlan], PlanCost]:
        trial = replace(
            request, kernels={n: k for n, k in kernels.items() if k.compute_kernel != "fused"}
        )
        placed = search_plan(trial)
        return placed, _evaluate(placed, request)

    for _ in range(16):
        kernels = choose_kernels(request.configs, hulls, budget)
        if kernels is None:
            break
        attempt = attempt_with(kernels)
        if _fits(attempt[1]):
            return attempt
        budget *= 0.9
    least = {config.name: hull[0].kernel for config, hull in zip(request.configs, hulls)}
    placed, cost = attempt_with(least)
    if _fits(cost):  # the budget (all ranks' together, less 5%) was too tight, not the ranks
        return placed, cost
    raise PlanDoesNotFitError(
        _describe_shortfall(
            cost,
            "cuda",
            "even with every table in host memory behind the smallest useful cache; "
            "add ranks or hosts with more memory",
        ),
        least_hbm={r: float(cost.memory_bytes[r]) for r in cost.shortfall()},
        short_bytes=_short_bytes(cost),
    )


def priced_by(request: SearchRequest, cost_model: str) -> Problem:
    """The request as a planning problem priced by `cost_model`: "shardrec" (cost_model.py) or
    "torchrec" (torchrec's estimators, torchrec_costs.py)."""
    if cost_model == "torchrec":
        from shardrec.sharding.torchrec.torchrec_costs import TorchrecProblem

        return TorchrecProblem(request)
    if cost_model == "shardrec":
        return Problem(request)
    raise ValueError(f"cost model {cost_model!r} is not one of shardrec, torchrec")


def cost_model_of(topo: ClusterTopology) -> str:
    """The step-time model to search with on this topology: its profile's verdict, else the
    default."""
    return topo.cost_model or DEFAULT_COST_MODEL[topo.device_kind]


def build_plan_file(
    table_plans: list[TablePlan],
    configs: list[EmbeddingBagConfig],
    topo: ClusterTopology,
    global_batch_size: int,
    cost: PlanCost,
    search: str,
) -> PlanFile:
    return PlanFile(
        schema_version=PLAN_SCHEMA_VERSION,
        fingerprint=plan_fingerprint(configs, topo.world_size, global_batch_size, topo.device_kind),
        tables=table_plans,
        planner=search,
        topology=topo,
        estimate=PlanEstimate.from_dict(cost.to_dict()),
    )
