"""A plan file as torchrec's ShardingPlan (what DistributedModelParallel takes) and back: one
ParameterSharding per table, its shards checked to tile the table exactly."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from shardrec.sharding.plan.plan_types import (
    DATA_PARALLEL,
    SEQUENCE_SHARDING_TYPES,
    UNPOOLED,
    PlanFile,
    Shard,
    TablePlan,
)

if (
    TYPE_CHECKING
):  # torchrec is imported where a plan becomes torchrec's: reading one (`plan show`) needs no torch
    from torchrec.distributed.types import ParameterSharding, ShardingPlan
    from torchrec.modules.embedding_configs import EmbeddingBagConfig


def check_shards(table_plan: TablePlan, config: EmbeddingBagConfig, world_size: int) -> None:
    for s in table_plan.shards:
        if not 0 <= s.rank < world_size:
            raise ValueError(
                f"table {table_plan.name}: shard on rank {s.rank}, world size is {world_size}"
            )
        if (
            s.row_offset + s.rows > config.num_embeddings
            or s.col_offset + s.cols > config.embedding_dim
        ):
            raise ValueError(
                f"table {table_plan.name}: shard {s} lies outside the table "
                f"[{config.num_embeddings} x {config.embedding_dim}]"
            )
    if table_plan.sharding_type == DATA_PARALLEL:
        return
    # Shards must tile the table: every weight in exactly one shard. On the grid that the
    # shards' own edges cut the table into, each cell is counted once per shard covering it.
    rows = np.unique(
        [0, config.num_embeddings]
        + [e for s in table_plan.shards for e in (s.row_offset, s.row_offset + s.rows)]
    )
    cols = np.unique(
        [0, config.embedding_dim]
        + [e for s in table_plan.shards for e in (s.col_offset, s.col_offset + s.cols)]
    )
    cover = np.zeros((len(rows) - 1, len(cols) - 1), dtype=np.int64)
    for s in table_plan.shards:
        r0, r1 = np.searchsorted(rows, [s.row_offset, s.row_offset + s.rows])
        c0, c1 = np.searchsorted(cols, [s.col_offset, s.col_offset + s.cols])
        cover[r0:r1, c0:c1] += 1
    if (cover > 1).any():
        raise ValueError(f"table {table_plan.name}: shards overlap")
    if (cover == 0).any():
        raise ValueError(
            f"table {table_plan.name}: shards leave part of the table "
            f"[{config.num_embeddings} x {config.embedding_dim}] uncovered"
        )


def to_parameter_sharding(
    t: TablePlan, device_kind: str, local_world_size: int
) -> ParameterSharding:
    """One table's torchrec ParameterSharding (data-parallel tables carry no sharding spec)."""
    from torchrec.distributed.sharding_plan import placement
    from torchrec.distributed.types import EnumerableShardingSpec, ParameterSharding, ShardMetadata

    cache_params = None
    if t.cache is not None:
        from fbgemm_gpu.tbe.cache.cache_config import CacheAlgorithm
        from torchrec.distributed.types import CacheParams

        algorithm = CacheAlgorithm.LFU if t.cache.algorithm == "lfu" else CacheAlgorithm.LRU
        cache_params = CacheParams(algorithm=algorithm, load_factor=t.cache.load_factor)
    if t.sharding_type == DATA_PARALLEL:
        return ParameterSharding(
            sharding_type=t.sharding_type, compute_kernel=t.compute_kernel, ranks=t.ranks
        )
    # In block order: torchrec buckets a row-wise table's ids to its shards in list order, so a
    # plan listing rank 1's rows 500..1000 first trained ids 0..499 on them.
    shards = sorted(t.shards, key=lambda s: (s.row_offset, s.col_offset))
    spec = EnumerableShardingSpec(
        [
            ShardMetadata(
                shard_offsets=[s.row_offset, s.col_offset],
                shard_sizes=[s.rows, s.cols],
                placement=placement(device_kind, s.rank, local_world_size),
            )
            for s in shards
        ]
    )
    return ParameterSharding(
        sharding_type=t.sharding_type,
        compute_kernel=t.compute_kernel,
        ranks=[s.rank for s in shards],
        sharding_spec=spec,
        cache_params=cache_params,
    )


def to_sharding_plan(
    plan: PlanFile,
    configs: list[EmbeddingBagConfig],
    module_path: str,
    world_size: int,
    local_world_size: int,
    device_kind: str,
    unpooled_path: str = "",
) -> ShardingPlan:
    """The torchrec ShardingPlan for the EmbeddingBagCollection at `module_path`
    (e.g. "sparse_arch.embedding_bag_collection") and, for a sequence model, the
    EmbeddingCollection of its unpooled tables (pooling NONE) at `unpooled_path`.

    For a 2D plan (sharding_group_size > 0) this is the plan of one sharding group, as
    DMPCollection(sharding_group_size=...) takes it. Raises ValueError if the plan does not
    place exactly the given tables within the ranks, or gives an unpooled table a type torchrec's
    EmbeddingCollection cannot build.
    """
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ShardingPlan

    if plan.sharding_group_size:
        # DMPCollection takes the plan of one sharding group and maps it onto every replica.
        world_size = plan.sharding_group_size
        local_world_size = min(local_world_size, world_size)
    by_name = {t.name: t for t in plan.tables}
    names = [config.name for config in configs]
    missing = [n for n in names if n not in by_name]
    extra = sorted(set(by_name) - set(names))
    if missing or extra:
        raise ValueError(
            f"plan does not match the model's tables (missing: {', '.join(missing) or 'none'}; "
            f"unknown: {', '.join(extra) or 'none'})"
        )
    module_plans: dict[str, EmbeddingModuleShardingPlan] = {}
    for config in configs:
        table_plan = by_name[config.name]
        check_shards(table_plan, config, world_size)
        unpooled = config.pooling.name == UNPOOLED
        if unpooled and table_plan.sharding_type not in SEQUENCE_SHARDING_TYPES:
            raise ValueError(
                f"table {config.name}: {table_plan.sharding_type} is not a type torchrec's "
                f"EmbeddingCollection builds for a sequence model's table (it builds "
                f"{', '.join(SEQUENCE_SHARDING_TYPES)}); re-plan"
            )
        path = unpooled_path if unpooled else module_path
        module_plans.setdefault(path, EmbeddingModuleShardingPlan())[config.name] = (
            to_parameter_sharding(table_plan, device_kind, local_world_size)
        )
    return ShardingPlan(module_plans)


def from_sharding_plan(
    module_plan: dict[str, ParameterSharding], configs: list[EmbeddingBagConfig], world_size: int
) -> list[TablePlan]:
    """Our per-table entries from a torchrec module plan (e.g. the one torchrec's planner made), in
    `configs` order."""
    out = []
    for config in configs:
        ps = module_plan[config.name]
        if ps.sharding_spec is None:
            ranks = ps.ranks if ps.ranks else list(range(world_size))
            shards = [Shard(r, 0, 0, config.num_embeddings, config.embedding_dim) for r in ranks]
        else:
            shards = [
                Shard(
                    md.placement.rank(),
                    md.shard_offsets[0],
                    md.shard_offsets[1],
                    md.shard_sizes[0],
                    md.shard_sizes[1],
                )
                for md in ps.sharding_spec.shards  # type: ignore[attr-defined]
            ]
        out.append(TablePlan(config.name, ps.sharding_type, ps.compute_kernel, shards))
    return out
