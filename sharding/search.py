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
from dataclasses import replace

import numpy as np

from shardrec.sharding import layouts
from shardrec.sharding.balance import Assignment, assign, move_table, refine_ranks
from shardrec.sharding.options import PIECE_TYPES, Option, Problem
from shardrec.sharding.plan_io import TablePlan
from shardrec.sharding.request import SearchRequest

logger = logging.getLogger(__name__)


def _initial(p: Problem, prefer: str) -> list[Option]:
    """A starting choice: the least total work per table, or a preferred type where allowed."""
    out = []
    for i, opts in enumerate(p.options):
        preferred = [o for o in opts if o.sharding_type == prefer]
        pool = preferred or opts
        out.append(min(pool, key=lambda o: (p.work(i, o), opts.index(o))))
    return out


def _candidates(p: Problem, a: Assignment, limit: int) -> list[int]:
    """Tables worth moving: the infeasible one, else the biggest contributors to the critical rank."""
    if a.infeasible >= 0:
        return [a.infeasible]
    crit = int(np.argmax(a.step))
    scored = []
    for i, o in enumerate(a.choice):
        if o.sharding_type in PIECE_TYPES:
            if crit in a.ranks[i]:
                pc = p.piece(i, o.shards)
                scored.append((-(pc.owner_s - pc.other_s) * a.ranks[i].count(crit), i))
        else:
            s, _ = p.spread(i, o.sharding_type)
            scored.append((-float(s.max()), i))
    scored.sort()
    return [i for _, i in scored[:limit]]


def _improve(p: Problem, a: Assignment, max_rounds: int, width: int) -> Assignment:
    """Local search over sharding types: switch one critical table at a time while the score drops."""
    assert a.infeasible < 0, "local search starts from a complete placement"
    for _ in range(max_rounds):
        best = a
        for i in _candidates(p, a, width):
            for o in p.options[i]:
                if o == a.choice[i]:
                    continue
                trial = move_table(p, a, i, o)
                if trial.score < best.score * (1 - 1e-9):
                    best = trial
            if best is not a:
                break
        if best is a:
            break
        a = best
    # Re-pack from scratch with the final types; keep whichever is better.
    packed = assign(p, a.choice)
    return packed if packed.score < a.score else a


def _to_tables(p: Problem, a: Assignment, kernel: str) -> list[TablePlan]:
    out = []
    for i, (cfg, o) in enumerate(zip(p.tables, a.choice)):
        k = p.cons[i].compute_kernels[0] if p.cons[i].compute_kernels else kernel
        st = o.sharding_type
        if st == "table_wise":
            out.append(layouts.table_wise(cfg, a.ranks[i][0], k))
        elif st in ("column_wise", "table_column_wise"):
            out.append(layouts.column_wise(cfg, a.ranks[i], k, st))
        elif st == "row_wise":
            out.append(layouts.row_wise(cfg, p.topo.world_size, k))
        elif st == "table_row_wise":
            out.append(layouts.table_row_wise(cfg, a.ranks[i][0], p.topo.local_world_size, k))
        else:
            out.append(layouts.data_parallel(cfg, p.topo.world_size))
    return out


TYPE_SUBSETS = (
    ("table_wise",),
    ("table_wise", "column_wise"),
    ("table_wise", "row_wise"),
    ("table_wise", "table_row_wise"),
    ("table_wise", "data_parallel"),
    ("table_wise", "column_wise", "row_wise", "data_parallel"),
    ("table_wise", "column_wise", "table_row_wise", "table_column_wise", "row_wise", "data_parallel"),
)


def _peak(p: Problem, i: int, o: Option) -> float:
    """The most one rank pays for the option beyond the all-to-all share every rank pays."""
    if o.sharding_type in PIECE_TYPES:
        pc = p.piece(i, o.shards)
        return pc.owner_s - pc.other_s
    return float(p.spread(i, o.sharding_type)[0].max())


def _targeted(p: Problem, target: float, types: tuple[str, ...]) -> list[Option]:
    """Per table, the least-work option (among `types` where the table allows any) whose peak stays under target."""
    out = []
    for i, opts in enumerate(p.options):
        pool = [o for o in opts if o.sharding_type in types] or opts
        fits = [o for o in pool if _peak(p, i, o) <= target]
        if fits:
            out.append(min(fits, key=lambda o: (p.work(i, o), opts.index(o))))
        else:
            out.append(min(pool, key=lambda o: (_peak(p, i, o), opts.index(o))))
    return out


def _seeds(p: Problem, steps: int = 24) -> list[Assignment]:
    """LPT packings of per-table choices for a grid of peak targets and type subsets, best first."""
    top = max(_peak(p, i, p.options[i][0]) for i in range(len(p.tables)))
    seen, results = set(), []
    for types in TYPE_SUBSETS:
        for k in range(steps):
            choice = _targeted(p, top * 0.7**k, types)
            key = tuple(choice)
            if key in seen:
                continue
            seen.add(key)
            results.append(assign(p, choice))
    for prefer in ("", "row_wise"):
        results.append(assign(p, _initial(p, prefer)))
    results.sort(key=lambda a: a.score)
    return results


def search_plan(request: SearchRequest, *, cost_model: str = "shardrec") -> list[TablePlan]:
    """The placement with the fastest critical rank: seeded LPT packings, then local search.

    Args:
        cost_model: "shardrec" (cost.py) or "torchrec" (torchrec's estimators, torchrec_costs.py).
    """
    r = request
    tables, topo, compute_kernel = r.tables, r.topology, r.compute_kernel
    if cost_model == "torchrec":
        from shardrec.sharding.torchrec_costs import TorchrecProblem

        p: Problem = TorchrecProblem(tables, topo, r.global_batch_size, r.constraints, r.pooling, r.optimizer, compute_kernel)
    elif cost_model == "shardrec":
        p = Problem(tables, topo, r.global_batch_size, r.constraints, r.pooling, r.optimizer, r.curves)
    else:
        raise ValueError(f"cost model {cost_model!r} is not one of shardrec, torchrec")
    rounds = max(8, min(200, 200_000 // max(1, len(tables))))
    width = 4 if len(tables) > 200 else 8
    best = None
    feasible = [a for a in _seeds(p) if a.infeasible < 0]
    for seed in feasible[:3]:
        a = refine_ranks(p, _improve(p, seed, rounds, width), max_moves=4 * len(tables))
        if best is None or a.score < best.score:
            best = a
    if best is None:
        # Nothing fits: return the placement with the least memory per rank, balanced without
        # the memory limit, so that the planner can report each rank's shortfall.
        p.topo = replace(topo, memory_bytes=2**62)
        best = assign(p, [min(opts, key=lambda o: (p.max_memory(i, o), opts.index(o))) for i, opts in enumerate(p.options)])
        p.topo = topo
    return _to_tables(p, best, compute_kernel)
