"""Shard layouts of each sharding type, as torchrec lays them out.

Row-wise blocks are ceil(rows / ranks) rows each in rank order, because torchrec's input
distribution buckets ids by that block size; column-wise shards are equal column blocks.
"""

from __future__ import annotations

from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding.plan.plan_layout import row_blocks
from shardrec.sharding.plan.plan_types import Shard, TablePlan


def table_wise(config: EmbeddingBagConfig, rank: int, kernel: str) -> TablePlan:
    return TablePlan(
        config.name,
        "table_wise",
        kernel,
        [Shard(rank, 0, 0, config.num_embeddings, config.embedding_dim)],
    )


def row_wise(config: EmbeddingBagConfig, world_size: int, kernel: str) -> TablePlan:
    ranks = list(range(world_size))
    shards = [
        Shard(r, off, 0, n, config.embedding_dim)
        for r, (off, n) in zip(ranks, row_blocks(config.num_embeddings, len(ranks)))
    ]
    return TablePlan(config.name, "row_wise", kernel, shards)


def table_row_wise(
    config: EmbeddingBagConfig, host: int, local_world_size: int, kernel: str
) -> TablePlan:
    ranks = [host * local_world_size + i for i in range(local_world_size)]
    shards = [
        Shard(r, off, 0, n, config.embedding_dim)
        for r, (off, n) in zip(ranks, row_blocks(config.num_embeddings, len(ranks)))
    ]
    return TablePlan(config.name, "table_row_wise", kernel, shards)


def column_wise(
    config: EmbeddingBagConfig, ranks: list[int], kernel: str, sharding_type: str = "column_wise"
) -> TablePlan:
    """len(ranks) equal column blocks, block i on ranks[i] (a rank may hold several)."""
    cols = config.embedding_dim // len(ranks)
    if cols * len(ranks) != config.embedding_dim:
        raise ValueError(
            f"table {config.name}: {config.embedding_dim} columns do not split into {len(ranks)} equal shards"
        )
    shards = [Shard(r, 0, i * cols, config.num_embeddings, cols) for i, r in enumerate(ranks)]
    return TablePlan(config.name, sharding_type, kernel, shards)


def data_parallel(config: EmbeddingBagConfig, world_size: int) -> TablePlan:
    shards = [
        Shard(r, 0, 0, config.num_embeddings, config.embedding_dim) for r in range(world_size)
    ]
    return TablePlan(config.name, "data_parallel", "dense", shards)
