"""A readable report of a plan: per table where it lives, per rank what it costs, the managed
tables' proposed row budgets; and its placements for machines (`--json`)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import TYPE_CHECKING

from rich.table import Table

from shardrec.sharding.plan.plan_types import UNPOOLED, PlanFile, Shard, TablePlan

if TYPE_CHECKING:  # an annotation only: a report need not load the row budgets module
    from shardrec.embeddings.managed.row_budget import Proposal

MiB = 2**20


def _ranks_text(ranks: list[int]) -> str:
    uniq = sorted(set(ranks))
    if len(uniq) > 2 and uniq == list(range(uniq[0], uniq[-1] + 1)):
        return f"{uniq[0]}-{uniq[-1]}"
    return ",".join(str(r) for r in uniq)


def held_shards(tp: TablePlan) -> list[Shard]:
    """The shards of `tp` that hold weights: a row-wise table of fewer rows than ranks (3 rows on
    4) lists an empty shard on each rank past its rows, as torchrec builds it."""
    return [s for s in tp.shards if s.rows and s.cols]


def idle_ranks(plan: PlanFile) -> list[int]:
    """Ranks that hold no rows of any table (of a 2D plan: group ranks); they run the dense part
    only."""
    world = plan.sharding_group_size or plan.fingerprint.world_size
    used = {s.rank for tp in plan.tables for s in held_shards(tp)}
    return [r for r in range(world) if r not in used]


def idle_ranks_warning(plan: PlanFile) -> str:
    """One line for a plan that leaves ranks without tables ("" when every rank holds some)."""
    idle = idle_ranks(plan)
    if not idle:
        return ""
    world = plan.sharding_group_size or plan.fingerprint.world_size
    return (
        f"{len(idle)} of {world} ranks hold no embedding table (ranks {_ranks_text(idle)}): their memory and "
        "lookups go unused; plan for fewer ranks, or allow row-wise/column-wise sharding for the largest tables"
    )


def _cache_text(tp) -> tuple[str, str]:
    """(cache rows, predicted hit rate) of a cached table; rows summed and the rate weighted over
    shards."""
    if tp.cache is None:
        return "", ""
    rows = sum(tp.cache.rows)
    weights = [s.rows for s in tp.shards]
    rate = sum(h * w for h, w in zip(tp.cache.hit_rates, weights)) / max(sum(weights), 1)
    return f"{rows:,} ({tp.cache.load_factor:.1%})", f"{rate:.1%}"


def tables_table(plan: PlanFile, limit: int = 60) -> Table:
    t = Table(title=f"tables ({len(plan.tables)}; planner {plan.planner})")
    cached = any(tp.cache is not None for tp in plan.tables)
    pooled = plan.estimate.ids_per_sample if plan.estimate is not None else {}
    unpooled = {f.name for f in plan.fingerprint.tables if f.pooling == UNPOOLED}
    columns = (
        ["table"]
        + (["lookup"] if unpooled else [])
        + ["sharding type", "kernel", "shards", "ranks"]
        + (["ids/sample"] if pooled else [])
    )
    for col in columns + (["cache rows", "hit rate"] if cached else []):
        t.add_column(col, justify="right" if col == "ids/sample" else "left")
    captions = [
        "ids/sample: the mean ids a sample looks up in the table (the data's statistics, or pooling_factors)"
    ]
    captions = captions if pooled else []
    if unpooled:
        captions.append(
            "lookup: bag (pooled, one vector a sample) or seq (a sequence model's table, unpooled: "
            "one vector per id, torchrec's EmbeddingCollection)"
        )
    if cached:
        captions.append(
            "cache rows: HBM cache of a fused_uvm_caching table (its load factor); hit rate: predicted share "
            "of a batch's unique rows found in it, from the data's id frequencies"
        )
    t.caption = "; ".join(captions) or None
    for tp in plan.tables[:limit]:
        held = held_shards(tp)
        empty = len(tp.shards) - len(held)
        row = [
            tp.name,
            *([("seq" if tp.name in unpooled else "bag")] if unpooled else []),
            tp.sharding_type,
            tp.compute_kernel,
            f"{len(held)} (+{empty} empty)" if empty else str(len(held)),
            _ranks_text([s.rank for s in held]),
        ]
        row += [f"{pooled.get(tp.name, 1.0):g}"] if pooled else []
        t.add_row(*row, *(_cache_text(tp) if cached else ()))
    if len(plan.tables) > limit:
        t.add_row(f"... {len(plan.tables) - limit} more", *[""] * (len(t.columns) - 1))
    return t


def ranks_table(plan: PlanFile, limit: int = 32) -> Table:
    est = plan.estimate
    ranks = est.ranks if est is not None else []
    critical = est.critical_rank if est is not None else None
    cap = est.memory_capacity_bytes / MiB if est is not None else 0
    device = est.device_memory_bytes / MiB if est is not None else 0
    step_ms = est.max_step_ms if est is not None else 0
    t = Table(title=f"ranks (critical path: rank {critical}, {step_ms:.3f} ms/step estimated)")
    of = (
        f"{device:,.0f} MiB per rank ({cap:,.0f} MiB planned, the rest kept free)"
        if device
        else f"{cap:,.0f} MiB per rank"
    )
    t.caption = (
        f"MiB: memory used of {of} = weights (wts) + optimizer (opt) + buffers (buf) + what every rank "
        "holds (dense layers, framework: fix); MiB sent per step (fwd+bwd) by all-to-all, "
        "reduce-scatter + all-gather, all-reduce"
    )
    host = any(r.host_bytes for r in ranks)
    if host:
        t.caption += "; cache: HBM of UVM caches, host: UVM tables' weights in host memory (MiB)"
    maps = max((r.id_map_bytes for r in ranks), default=0)
    if maps:
        where = "in fix" if plan.fingerprint.device_kind == "cpu" else "host memory"
        t.caption += f"; the managed tables' id maps: {maps / MiB:,.1f} MiB on every rank ({where})"
    # Short headers keep the table whole on an 80-column terminal.
    columns = ["rank", "MiB", "wts", "opt", "buf", "fix"] + (["cache", "host"] if host else [])
    for col in columns + ["lkp ms", "comm ms", "a2a", "rs+ag", "allred"]:
        t.add_column(col, justify="right")
    shown = ranks if len(ranks) <= limit else sorted(ranks, key=lambda r: -r.step_ms)[:limit]
    for r in shown:
        b = r.bytes_sent
        t.add_row(
            f"{r.rank}{'*' if r.rank == critical else ''}",
            f"{r.memory_bytes / MiB:.1f}",
            f"{r.weights_bytes / MiB:.1f}",
            f"{r.optimizer_bytes / MiB:.1f}",
            f"{r.buffer_bytes / MiB:.1f}",
            f"{r.fixed_bytes / MiB:.1f}",
            *((f"{r.cache_bytes / MiB:.1f}", f"{r.host_bytes / MiB:.1f}") if host else ()),
            f"{r.lookup_ms:.2f}",
            f"{r.comm_ms:.2f}",
            f"{b['all_to_all'] / MiB:.2f}",
            f"{(b['reduce_scatter'] + b['all_gather']) / MiB:.2f}",
            f"{b['all_reduce'] / MiB:.2f}",
        )
    if len(ranks) > limit:
        t.caption += f"; the {limit} slowest of {len(ranks)} ranks"
    return t


def budgets_table(budgets: list[Proposal]) -> Table:
    """The managed tables' proposed row budgets (trainer.job.planning.propose_row_budgets)."""
    t = Table(
        title="managed tables: row budgets from the data's distinct-id curve",
        caption="wanted: rows that hold 99% of the lookups of ids seen admit_after times or more, "
        "+10%; proposed: within the ranks' memory, as planned at those rows (equal lookups per "
        "byte where short); "
        "kept: the proposed rows' share of all the feature's lookups",
    )
    for col in ("table", "distinct ids", "wanted", "proposed", "kept", "B/row (all ranks)"):
        t.add_column(col, justify="right")
    for b in budgets:
        t.add_row(
            b.feature,
            f"{b.distinct:,}",
            f"{b.wanted:,}",
            f"{b.rows:,}",
            f"{b.kept:.1%}",
            f"{b.bytes_per_row:,.0f}",
        )
    return t


def summary(plan: PlanFile) -> dict:
    """A short machine-readable summary (counts by sharding type, critical path)."""
    return {
        "planner": plan.planner,
        "tables": len(plan.tables),
        "sharding_types": dict(sorted(Counter(t.sharding_type for t in plan.tables).items())),
        "world_size": plan.fingerprint.world_size,
        "max_step_ms": plan.estimate.max_step_ms if plan.estimate is not None else None,
        "critical_rank": plan.estimate.critical_rank if plan.estimate is not None else None,
        "fingerprint": plan.fingerprint.digest,
        "sharding_group_size": plan.sharding_group_size,
    }


def placements(plan: PlanFile) -> dict:
    """--json's per table placement (sharding type, ranks, kernel and, for cached tables, the cache:
    rows, hit rates) and per-rank estimate of a plan."""
    tables = [
        {
            "name": t.name,
            "sharding_type": t.sharding_type,
            "ranks": t.ranks,
            "compute_kernel": t.compute_kernel,
            **({"cache": dataclasses.asdict(t.cache)} if t.cache is not None else {}),
        }
        for t in plan.tables
    ]
    return {
        "tables_plan": tables,
        "estimate": plan.estimate.to_dict() if plan.estimate is not None else {},
    }


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"
