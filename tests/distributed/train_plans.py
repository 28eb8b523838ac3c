"""Plan files with explicit layouts for the trainer's distributed tests."""

from __future__ import annotations

from shardrec.sharding.plan.plan_file import plan_fingerprint
from shardrec.sharding.plan.plan_types import PLAN_SCHEMA_VERSION, PlanFile, Shard, TablePlan


def _row_blocks(rows: int, parts: int) -> list[tuple[int, int]]:
    # torchrec's row-wise convention: blocks of ceil(rows / parts), the last one shorter.
    block = -(-rows // parts)
    return [(i * block, min(block, rows - i * block)) for i in range(parts) if i * block < rows]


def table_plan(kind: str, name: str, rows: int, dim: int, world_size: int, rank: int) -> TablePlan:
    """One table laid out as `kind`; table-wise tables go to `rank`."""
    if kind == "table_wise":
        return TablePlan(name, kind, "fused", [Shard(rank, 0, 0, rows, dim)])
    if kind == "row_wise":
        return TablePlan(
            name,
            kind,
            "fused",
            [Shard(r, off, 0, n, dim) for r, (off, n) in enumerate(_row_blocks(rows, world_size))],
        )
    if kind == "column_wise":
        cols = dim // 2  # two column shards, on ranks rank and rank + 1
        return TablePlan(
            name,
            kind,
            "fused",
            [Shard((rank + i) % world_size, 0, i * cols, rows, cols) for i in range(2)],
        )
    if kind == "data_parallel":
        return TablePlan(
            name, kind, "dense", [Shard(r, 0, 0, rows, dim) for r in range(world_size)]
        )
    raise ValueError(kind)


MIXES = {
    "mixed": ("row_wise", "column_wise", "data_parallel", "table_wise"),
    # No column cuts: what row-wise Adagrad is plan-invariant over (trainer/model/objective.py).
    "mixed_rows": ("row_wise", "data_parallel", "table_wise"),
}


def make_plan(tables, layout: str, world_size: int, global_batch_size: int) -> PlanFile:
    """Every table as `layout`, or a mix (MIXES): its kinds in turn."""
    placed = []
    for i, t in enumerate(tables):
        kind = MIXES[layout][i % len(MIXES[layout])] if layout in MIXES else layout
        placed.append(
            table_plan(kind, t.name, t.num_embeddings, t.embedding_dim, world_size, i % world_size)
        )
    return PlanFile(
        schema_version=PLAN_SCHEMA_VERSION,
        fingerprint=plan_fingerprint(tables, world_size, global_batch_size, "cpu"),
        tables=placed,
        planner="test",
    )
