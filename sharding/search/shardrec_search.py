"""shardrec's search: choose a sharding type per table, then balance the pieces over ranks.

A placement is a longest-processing-time-first (LPT) packing of the pieces' owner costs on
top of the spreads, under each rank's memory (balance.py). Seeds come from a grid of peak
targets (per table, the least-work option whose costliest rank stays under the target) over
a few sets of sharding types; local search then switches the critical rank's tables to other
options while the slowest rank gets faster, and single pieces move or swap between the
slowest and fastest ranks. Deterministic: the same inputs give the same plan.
"""

from __future__ import annotations

import logging

import numpy as np

from shardrec.sharding.cost import layouts
from shardrec.sharding.plan.plan_types import TablePlan
from shardrec.sharding.search.balance import Assignment, assign, move_table, refine_ranks
from shardrec.sharding.search.options import PIECE_TYPES, Option, Problem
from shardrec.sharding.search.request import SearchRequest

logger = logging.getLogger(__name__)


def _initial(problem: Problem, prefer: str) -> list[Option]:
    """A starting choice: the least total work per table, or a preferred type where allowed."""
    out = []
    for index, options in enumerate(problem.options):
        preferred = [option for option in options if option.sharding_type == prefer]
        pool = preferred or options
        out.append(
            min(pool, key=lambda option: (problem.work(index, option), options.index(option)))
        )
    return out


def _candidates(problem: Problem, current: Assignment, limit: int) -> list[int]:
    """Tables worth moving: the infeasible one, else the biggest contributors to the critical
    rank."""
    if current.infeasible >= 0:
        return [current.infeasible]
    critical = int(np.argmax(current.step))
    scored = []
    for index, option in enumerate(current.choice):
        if option.sharding_type in PIECE_TYPES:
            if critical in current.ranks[index]:
                piece = problem.piece(index, option.shards)
                scored.append(
                    (-(piece.owner_s - piece.other_s) * current.ranks[index].count(critical), index)
                )
        else:
            spread_step, _ = problem.spread(index, option.sharding_type)
            scored.append((-float(spread_step.max()), index))
    scored.sort()
    return [index for _, index in scored[:limit]]


def _improve(problem: Problem, current: Assignment, max_rounds: int, width: int) -> Assignment:
    """Local search over sharding types: switch one critical table at a time while the score
    drops."""
    assert current.infeasible < 0, "local search starts from a complete placement"
    for _ in range(max_rounds):
        best = current
        for index in _candidates(problem, current, width):
            for option in problem.options[index]:
                if option == current.choice[index]:
                    continue
                trial = move_table(problem, current, index, option)
                if trial.score < best.score * (1 - 1e-9):
                    best = trial
            if best is not current:
                break
        if best is current:
            break
        current = best
    # Re-pack from scratch with the final types; keep whichever is better.
    packed = assign(problem, current.choice)
    return packed if packed.score < current.score else current


def _to_table_plans(problem: Problem, chosen: Assignment, compute_kernel: str) -> list[TablePlan]:
    """The chosen options and ranks as one TablePlan per table (a table's constraint may pin its
    kernel)."""
    out = []
    world_size, host_size = problem.topo.world_size, problem.topo.local_world_size
    for index, (config, option) in enumerate(zip(problem.configs, chosen.choice)):
        kernels = problem.cons[index].compute_kernels
        kernel = kernels[0] if kernels else compute_kernel
        sharding_type, ranks = option.sharding_type, chosen.ranks[index]
        if sharding_type == "table_wise":
            out.append(layouts.table_wise(config, ranks[0], kernel))
        elif sharding_type in ("column_wise", "table_column_wise"):
            out.append(layouts.column_wise(config, ranks, kernel, sharding_type))
        elif sharding_type == "row_wise":
            out.append(layouts.row_wise(config, world_size, kernel))
        elif sharding_type == "table_row_wise":
            out.append(layouts.table_row_wise(config, ranks[0], host_size, kernel))
        else:
            out.append(layouts.data_parallel(config, world_size))
        out[-1] = problem.with_kernel(index, out[-1])
    return out


TYPE_SUBSETS = (
    ("table_wise",),
    ("table_wise", "column_wise"),
    ("table_wise", "row_wise"),
    ("table_wise", "table_row_wise"),
    ("table_wise", "data_parallel"),
    ("table_wise", "column_wise", "row_wise", "data_parallel"),
    (
        "table_wise",
        "column_wise",
        "table_row_wise",
        "table_column_wise",
        "row_wise",
        "data_parallel",
    ),
)


def _peak(problem: Problem, index: int, option: Option) -> float:
    """The most one rank pays for the option beyond the all-to-all share every rank pays."""
    if option.sharding_type in PIECE_TYPES:
        piece = problem.piece(index, option.shards)
        return piece.owner_s - piece.other_s
    return float(problem.spread(index, option.sharding_type)[0].max())


def _targeted(problem: Problem, target: float, types: tuple[str, ...]) -> list[Option]:
    """Per table, the least-work option (among `types` where the table allows any) whose peak stays
    under target."""
    out = []
    for index, options in enumerate(problem.options):
        pool = [option for option in options if option.sharding_type in types] or options
        fits = [option for option in pool if _peak(problem, index, option) <= target]
        if fits:
            out.append(
                min(fits, key=lambda option: (problem.work(index, option), options.index(option)))
            )
        else:
            out.append(
                min(pool, key=lambda option: (_peak(problem, index, option), options.index(option)))
            )
    return out


def _seeds(problem: Problem, steps: int = 24) -> list[Assignment]:
    """LPT packings of per-table choices for a grid of peak targets and type subsets, best first."""
    top = max(
        _peak(problem, index, problem.options[index][0]) for index in range(len(problem.configs))
    )
    seen, results = set(), []
    for types in TYPE_SUBSETS:
        for level in range(steps):
            choice = _targeted(problem, top * 0.7**level, types)
            key = tuple(choice)
            if key in seen:
                continue
            seen.add(key)
            results.append(assign(problem, choice))
    for prefer in ("", "row_wise"):
        results.append(assign(problem, _initial(problem, prefer)))
    results.sort(key=lambda seeded: seeded.score)
    return results


def _least_memory(problem: Problem) -> Assignment:
    """Nothing fits: the placement with the least memory per rank, balanced without the memory
    limit, so that the planner can report each rank's shortfall."""
    capacity = problem.capacity
    problem.capacity = float("inf")
    choice = [
        min(options, key=lambda option: (problem.max_memory(index, option), options.index(option)))
        for index, options in enumerate(problem.options)
    ]
    packed = assign(problem, choice)
    problem.capacity = capacity
    return packed


def search_plan(request: SearchRequest, *, problem: Problem | None = None) -> list[TablePlan]:
    """The placement with the fastest critical rank: seeded LPT packings, then local search.

    Args:
        problem: the request priced by another cost model (torchrec's estimators:
            sharding/torchrec/torchrec_costs.py's TorchrecProblem); default: shardrec's
            (cost_model.py).
    Returns:
        One TablePlan per request.configs entry, in that order.
    """
    problem = problem if problem is not None else Problem(request)
    num_tables = len(request.configs)
    rounds = max(8, min(200, 200_000 // max(1, num_tables)))
    width = 4 if num_tables > 200 else 8
    best = None
    feasible = [seed for seed in _seeds(problem) if seed.infeasible < 0]
    for seed in feasible[:3]:
        refined = refine_ranks(
            problem, _improve(problem, seed, rounds, width), max_moves=4 * num_tables
        )
        if best is None or refined.score < best.score:
            best = refined
    if best is None:
        best = _least_memory(problem)
    return _to_table_plans(problem, best, request.compute_kernel)
