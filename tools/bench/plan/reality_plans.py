"""The spread of plans `bench plan-reality` trains: both planners' plans and deliberately different
ones.

At least 12 distinct placements of one table set: shardrec's plan (its search on its own cost
model and on torchrec's estimators), torchrec's planner's, every sharding type alone, mixes, a
greedy table-wise packing, plans that are bad on purpose (everything on one rank, everything
data-parallel, table-wise by the most loaded rank) and seeded random placements. The planners'
plans are always kept (each planner's plan is measured, even when both planners agree); other
placements equal to one already listed are dropped.
"""

from __future__ import annotations

import json

import numpy as np
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding.cost import layouts
from shardrec.sharding.plan.plan_types import TablePlan
from shardrec.sharding.search.request import SearchRequest

RANDOM_PLANS = 3


def _table_wise_greedy(
    configs: list[EmbeddingBagConfig], world_size: int, worst: bool
) -> list[TablePlan]:
    """Largest table first onto the least (or, on purpose, the most) loaded rank."""
    load = [0.0] * world_size
    placed = {}
    for config in sorted(configs, key=lambda c: -c.num_embeddings * c.embedding_dim):
        pick = max if worst else min
        rank = pick(range(world_size), key=lambda r: (load[r], -r if worst else r))
        load[rank] += config.num_embeddings * config.embedding_dim + 1
        placed[config.name] = layouts.table_wise(config, rank, "fused")
    return [placed[config.name] for config in configs]


def _mixed(configs: list[EmbeddingBagConfig], world_size: int) -> list[TablePlan]:
    """The largest quarter row-wise, the smallest quarter data-parallel, the rest column-wise."""
    order = sorted(configs, key=lambda c: c.num_embeddings)
    small = {c.name for c in order[: len(order) // 4]}
    large = {c.name for c in order[len(order) - len(order) // 4 :]}
    ranks = list(range(world_size))
    out = []
    for config in configs:
        if config.name in small:
            out.append(layouts.data_parallel(config, world_size))
        elif config.name in large:
            out.append(layouts.row_wise(config, world_size, "fused"))
        else:
            out.append(layouts.column_wise(config, ranks, "fused"))
    return out


def _random(configs: list[EmbeddingBagConfig], world_size: int, seed: int) -> list[TablePlan]:
    """A seeded random type and rank per table; data-parallel only for tables below the median size
    (a large replicated table would dominate every rank's memory)."""
    rng = np.random.default_rng([seed, 23])
    median = float(np.median([c.num_embeddings for c in configs]))
    out = []
    for config in configs:
        kinds = ["table_wise", "row_wise", "column_wise"] + (
            ["data_parallel"] if config.num_embeddings < median else []
        )
        kind = kinds[int(rng.integers(len(kinds)))]
        if kind == "table_wise":
            out.append(layouts.table_wise(config, int(rng.integers(world_size)), "fused"))
        elif kind == "row_wise":
            out.append(layouts.row_wise(config, world_size, "fused"))
        elif kind == "column_wise":
            ranks = [int(r) for r in rng.permutation(world_size)]
            out.append(layouts.column_wise(config, ranks, "fused"))
        else:
            out.append(layouts.data_parallel(config, world_size))
    return out


def reality_plans(request: SearchRequest, seed: int = 0) -> dict[str, tuple[str, list[TablePlan]]]:
    """Name -> (source: shardrec, torchrec, simple or bad, placement), distinct placements only."""
    from shardrec.sharding.planner import priced_by
    from shardrec.sharding.search.shardrec_search import search_plan
    from shardrec.sharding.torchrec.torchrec_planner import torchrec_plan

    configs, W = request.configs, request.topology.world_size
    ranks = list(range(W))
    candidates: list[tuple[str, str, list[TablePlan]]] = [
        ("shardrec", "shardrec", search_plan(request)),
        (
            "shardrec on torchrec's estimators",
            "shardrec",
            search_plan(request, problem=priced_by(request, "torchrec")),
        ),
        ("torchrec", "torchrec", torchrec_plan(request)),
        ("all row-wise", "simple", [layouts.row_wise(c, W, "fused") for c in configs]),
        ("all column-wise", "simple", [layouts.column_wise(c, ranks, "fused") for c in configs]),
        (
            "all table-row-wise",
            "simple",
            [layouts.table_row_wise(c, 0, W, "fused") for c in configs],
        ),
        (
            "all table-column-wise",
            "simple",
            [layouts.column_wise(c, ranks, "fused", "table_column_wise") for c in configs],
        ),
        ("table-wise, greedy", "simple", _table_wise_greedy(configs, W, worst=False)),
        ("mixed: dp small, rw large, cw rest", "simple", _mixed(configs, W)),
        ("all on rank 0", "bad", [layouts.table_wise(c, 0, "fused") for c in configs]),
        ("table-wise, most loaded rank", "bad", _table_wise_greedy(configs, W, worst=True)),
        ("all data-parallel", "bad", [layouts.data_parallel(c, W) for c in configs]),
    ]
    candidates += [
        (f"random {i}", "random", _random(configs, W, seed + i)) for i in range(RANDOM_PLANS)
    ]
    out: dict[str, tuple[str, list[TablePlan]]] = {}
    seen = set()
    for name, source, placed in candidates:
        key = json.dumps(
            [[t.sharding_type, [vars(s) for s in t.shards]] for t in placed], sort_keys=True
        )
        if key not in seen or source in ("shardrec", "torchrec"):
            seen.add(key)
            out[name] = (source, placed)
    return out
