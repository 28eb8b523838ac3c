"""A plan file's shards against the layout torchrec builds for each sharding type, checked before
any rank starts and without torch: a hand-edited plan (a row-wise table left with one shard, a
shard on rank 5 of 2, half a table, a table gone) is refused in one line naming the table, not in
the ranks with torchrec's traceback, or worse, trained with ids bucketed to the wrong rank.

The layouts are those of sharding/cost/layouts.py, which both planners' plans follow: a table-wise
table is one shard; row-wise blocks are ceil(rows / ranks) rows on the ranks in order (torchrec's
input distribution buckets ids by that block size); column-wise shards are equal column blocks of
every row; a data-parallel table is whole on every rank.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardrec.embeddings.dims import WIDTH_MULTIPLE, TableSpec
from shardrec.sharding.plan.plan_types import PlanFile, TableFingerprint, TablePlan

Geometry = tuple[int, int, int, int, int]
"""(rank, row offset, col offset, rows, cols) of a shard."""


def row_blocks(rows: int, ranks: int) -> list[tuple[int, int]]:
    """(offset, size) of each of `ranks` row blocks: ceil-sized, trailing ones possibly empty
    (the planners' layouts, sharding/cost/layouts.py, are made of these)."""
    block = -(-rows // ranks)
    return [(min(i * block, rows), min(block, rows - min(i * block, rows))) for i in range(ranks)]


def expected_layout(
    t: TablePlan, rows: int, dim: int, world_size: int, local_world_size: int
) -> list[Geometry] | None:
    """The shards torchrec builds for `t`'s sharding type on the ranks `t` names (None: no such
    layout, e.g. columns that do not split evenly)."""
    shards, st = t.shards, t.sharding_type
    if st == "table_wise":
        return [(shards[0].rank if shards else 0, 0, 0, rows, dim)]
    if st == "data_parallel":
        return [(r, 0, 0, rows, dim) for r in range(world_size)]
    if st in ("row_wise", "table_row_wise"):
        if st == "row_wise":
            ranks = list(range(world_size))
        else:  # the host of the first shard, all of its ranks
            host = min((s.rank for s in shards), default=0) // local_world_size
            ranks = [host * local_world_size + i for i in range(local_world_size)]
        blocks = zip(ranks, row_blocks(rows, len(ranks)))
        return [(r, off, 0, n, dim) for r, (off, n) in blocks if n]
    by_cols = sorted(shards, key=lambda s: s.col_offset)
    if not by_cols or dim % len(by_cols):
        return None
    cols = dim // len(by_cols)
    return [(s.rank, 0, i * cols, rows, cols) for i, s in enumerate(by_cols)]


def _shown(g: Geometry) -> str:
    rank, r0, c0, rows, cols = g
    return f"rank {rank}: rows {r0}..{r0 + rows}, columns {c0}..{c0 + cols}"


def check_layout(
    plan: PlanFile, tables: Sequence[TableSpec | TableFingerprint], world_size: int
) -> None:
    """ValueError, in one line naming the table, for a plan whose tables are not the job's or
    whose shards are not the layout of their sharding type. `tables`: the job's, or the plan's own
    fingerprint's where there is no job (`plan show`)."""
    specs = {t.name: t for t in tables}
    planned = [t.name for t in plan.tables]
    missing = [name for name in specs if name not in planned]
    if missing:
        raise ValueError(
            f"table {missing[0]}: not in the plan (was the plan edited? re-run `shardrec plan`)"
        )
    extra = [name for name in planned if name not in specs]
    if extra:
        raise ValueError(
            f"table {extra[0]}: in the plan, not in the job (was the plan edited? re-run "
            "`shardrec plan`)"
        )
    # A 2D plan (CUDA only) lays each table out over its sharding group's ranks.
    ranks = plan.sharding_group_size or world_size
    local = min(plan.topology.local_world_size if plan.topology else ranks, ranks)
    for t in plan.tables:
        spec = specs[t.name]
        for s in t.shards:
            if not 0 <= s.rank < ranks:
                raise ValueError(f"table {t.name}: shard on rank {s.rank}, world size is {ranks}")
        want = expected_layout(t, spec.rows, spec.dim, ranks, local)
        # Empty trailing row blocks may be listed or left out (torchrec's planner lists them).
        got = sorted(
            (s.rank, s.row_offset, s.col_offset, s.rows, s.cols)
            for s in t.shards
            if s.rows and s.cols
        )
        if want is None or sorted(want) != got:
            first = next((g for g in got if want is None or g not in want), None)
            what = f" ({_shown(first)})" if first else f" ({len(got)} shards)"
            raise ValueError(
                f"table {t.name}: its shards{what} are not a {t.sharding_type} layout of its "
                f"{spec.rows} x {spec.dim} weights on {ranks} ranks (was the plan edited? "
                "re-run `shardrec plan`)"
            )
        cols = want[0][4] if want else 0
        if t.sharding_type in ("column_wise", "table_column_wise") and cols % WIDTH_MULTIPLE:
            raise ValueError(
                f"table {t.name}: its column shards are {cols} columns wide, not a multiple of "
                f"{WIDTH_MULTIPLE} (fbgemm's kernels need one; was the plan edited? re-run "
                "`shardrec plan`)"
            )


HOST_TYPES = ("table_row_wise", "table_column_wise")
"""Sharding types whose shards lie within one host: their layout holds only on hosts of the size
the plan was made for."""


def check_host_size(plan: PlanFile, local_world_size: int) -> None:
    """ValueError, in one line naming the table, for a plan whose host-bound tables were laid out
    for hosts of another number of ranks (torchrec would fail inside the ranks building them)."""
    planned = plan.topology.local_world_size if plan.topology else local_world_size
    if plan.sharding_group_size or planned == local_world_size:
        return
    bound = next((t for t in plan.tables if t.sharding_type in HOST_TYPES), None)
    if bound is not None:
        raise ValueError(
            f"table {bound.name} is {bound.sharding_type}, laid out for hosts of {planned} "
            f"rank{'s' if planned != 1 else ''} "
            f"(the plan's --local-world-size); this job runs {local_world_size} ranks a host: "
            f"re-run `shardrec plan --local-world-size {local_world_size}`"
        )
