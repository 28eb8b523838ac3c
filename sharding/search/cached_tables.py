"""Tables past device memory: which go to host memory behind an HBM cache, and how large a cache.

On a CUDA topology whose HBM (after the reserve) cannot hold every table, a table can keep its
weights in host memory: fused_uvm_caching keeps its hottest rows in an HBM cache of
`load_factor` of its rows (fbgemm fetches each batch's missing rows over the host link and
writes evicted rows back), fused_uvm reads every row over the link (for a table whose ids are
spread so evenly that a cache would hit only its own share of rows).

Each table's options (fused, a cache at each load factor of CLF_GRID, no cache) cost HBM and step
time (cost_model.py, with hit rates from the data's id-frequency curve, hit_rates.py). Choosing one
option per table to minimise the added time under an HBM budget is a multiple-choice knapsack:
on every table's lower convex hull of (HBM, time) the greedy that buys the steepest time saving
per byte first is optimal for the relaxation, and within one hull step of optimal here. The
search then places the tables with their kernels, and planner.py shrinks the budget until the
placement fits every rank.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace

from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding.cost import layouts
from shardrec.sharding.cost.comms import Workload
from shardrec.sharding.cost.cost_model import rank_fixed_bytes, table_cost
from shardrec.sharding.cost.hit_rates import FrequencyCurve, lru_hit_rate, min_cache_rows, slots
from shardrec.sharding.plan.plan_types import CachePlan, TablePlan

CLF_GRID = (0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8)
"""Cache load factors tried per table (torchrec requires one strictly between 0 and 1)."""


@dataclass(frozen=True)
class TableKernel:
    """A table's compute kernel and, for fused_uvm_caching, its cache's load factor."""

    compute_kernel: str
    load_factor: float = 0.0


def with_kernel(
    table_plan: TablePlan,
    kernel: TableKernel | None,
    curve: FrequencyCurve | None,
    ids_by_frequency: bool,
) -> TablePlan:
    """`table_plan` on `kernel`: a cached table gets each shard's cache size and predicted hit rate
    (column shards see every lookup of the table, row-wise shards their block's)."""
    if kernel is None or table_plan.sharding_type == "data_parallel":
        return table_plan
    if kernel.compute_kernel != "fused_uvm_caching":
        return replace(table_plan, compute_kernel=kernel.compute_kernel, cache=None)
    rows, hits, fetched = [], [], []
    for shard in table_plan.shards:
        size = slots(shard.rows, kernel.load_factor)
        rows.append(size)
        if curve is None:  # no data: torchrec's assumption, hits as the share of rows cached
            hits.append(min(1.0, size / shard.rows))
            fetched.append(0.0)
            continue
        block = curve.block(shard.row_offset, shard.rows, ids_by_frequency)
        rate = lru_hit_rate(block, size)
        hits.append(round(rate.unique_hit_rate, 6))
        fetched.append(round(rate.fetched_rows, 3))
    cache = CachePlan(
        load_factor=kernel.load_factor, rows=rows, hit_rates=hits, fetched_rows=fetched
    )
    return replace(table_plan, compute_kernel="fused_uvm_caching", cache=cache)


@dataclass(frozen=True)
class _Option:
    kernel: TableKernel
    hbm: float
    seconds: float
    host: float


def table_options(
    config: EmbeddingBagConfig,
    curve: FrequencyCurve | None,
    ids_by_frequency: bool,
    cost_args: dict,
    allowed: tuple[str, ...],
) -> list[_Option]:
    """The table's kernels and caches, each priced table-wise on one rank (HBM, step seconds,
    host)."""
    kernels = []
    if "fused" in allowed:
        kernels.append(TableKernel("fused"))
    if "fused_uvm_caching" in allowed and curve is not None:
        smallest = min_cache_rows(curve)
        kernels += [
            TableKernel("fused_uvm_caching", f)
            for f in CLF_GRID
            if slots(config.num_embeddings, f) >= smallest
        ]
    if "fused_uvm" in allowed:
        kernels.append(TableKernel("fused_uvm"))
    out = []
    for kernel in kernels:
        placed = with_kernel(
            layouts.table_wise(config, 0, "fused"), kernel, curve, ids_by_frequency
        )
        cost = table_cost(placed, config, **cost_args)
        host = float(cost.host_bytes[0]) if cost.host_bytes is not None else 0.0
        out.append(_Option(kernel, float(cost.memory_bytes[0]), float(cost.step_s[0]), host))
    return out


def _hull(options: list[_Option]) -> list[_Option]:
    """The lower convex hull of (HBM, seconds), from the least HBM: the options worth buying in
    turn."""
    points = sorted(options, key=lambda o: (o.hbm, o.seconds))
    hull: list[_Option] = []
    for o in points:
        if hull and o.seconds >= hull[-1].seconds:
            continue  # more HBM for no time saved
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b is above the segment a -> o: never the best buy
            if (b.seconds - a.seconds) * (o.hbm - a.hbm) >= (o.seconds - a.seconds) * (
                b.hbm - a.hbm
            ):
                hull.pop()
            else:
                break
        hull.append(o)
    return hull


def choose_kernels(
    configs: list[EmbeddingBagConfig],
    hulls: list[list[_Option]],
    budget_bytes: float,
) -> dict[str, TableKernel] | None:
    """Per table the hull option bought by the greedy under `budget_bytes` of HBM for all tables;
    None when even the least HBM of every table exceeds it."""
    at = [0] * len(hulls)
    used = sum(h[0].hbm for h in hulls)
    if used > budget_bytes:
        return None
    heap = []
    for i, h in enumerate(hulls):
        if len(h) > 1:
            heapq.heappush(
                heap, (-(h[0].seconds - h[1].seconds) / max(h[1].hbm - h[0].hbm, 1.0), i)
            )
    while heap:
        _, i = heapq.heappop(heap)
        h, k = hulls[i], at[i]
        extra = h[k + 1].hbm - h[k].hbm
        if used + extra > budget_bytes:
            continue  # this step does not fit; cheaper steps of other tables may
        used += extra
        at[i] = k + 1
        if k + 2 < len(h):
            heapq.heappush(
                heap,
                (-(h[k + 1].seconds - h[k + 2].seconds) / max(h[k + 2].hbm - h[k + 1].hbm, 1.0), i),
            )
    return {config.name: hulls[i][at[i]].kernel for i, config in enumerate(configs)}


def kernel_hulls(
    request, frequencies: dict[str, FrequencyCurve], ids_by_frequency: bool, constraints
) -> list:
    """Every table's hull of options (fused, cached, uvm) for a CUDA SearchRequest."""
    cost_args = dict(
        pooling=0.0,
        topo=request.topology,
        global_batch_size=request.global_batch_size,
        optimizer=request.optimizer,
    )
    hulls = []
    for config in request.configs:
        pinned = constraints.get(config.name)
        allowed = (
            tuple(pinned.compute_kernels) if pinned is not None and pinned.compute_kernels else None
        )
        allowed = allowed or ("fused", "fused_uvm_caching", "fused_uvm")
        args = dict(cost_args, pooling=request.pooling.get(config.name, 1.0))
        options = table_options(
            config, frequencies.get(config.name), ids_by_frequency, args, allowed
        )
        hulls.append(_hull(options))
    return hulls


def table_budget(request) -> float:
    """HBM all ranks together may give the tables: usable memory less what every rank holds
    anyway."""
    topo = request.topology
    fixed = rank_fixed_bytes(
        topo,
        Workload(request.global_batch_size, topo.world_size),
        request.configs,
        request.pooling,
        request.dense,
    )
    return topo.world_size * (topo.usable_bytes - fixed)
