"""The one conversion of a job into the planner's request: what `shardrec plan` plans and what
training plans at start-up when it is given no plan file, so that both make the same plan."""

from __future__ import annotations

from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding.machine.memory import DenseFootprint
from shardrec.sharding.machine.topology import ClusterTopology
from shardrec.sharding.search.request import DatasetStatistics, PlanRequest
from shardrec.trainer.job.config import OptimConfig, ShardingConfig, TrainConfig


def plan_request(
    configs: list[EmbeddingBagConfig],
    statistics: DatasetStatistics,
    *,
    train: TrainConfig,
    sharding: ShardingConfig,
    optim: OptimConfig,
    world_size: int,
    local_world_size: int,
    device_kind: str,
    topology: ClusterTopology | None = None,
    dense: DenseFootprint | None = None,
    sharding_group_size: int = 0,
    sync_every: int = 1,
) -> PlanRequest:
    """The PlanRequest of a job's tables for `world_size` ranks: its global batch, constraints,
    compute kernel and sparse optimizer, and the dense layers' footprint
    (sharding.memory.dense_footprint) that every rank holds; the rest (topology, 2D) is the
    planner's own choice."""
    return PlanRequest(
        configs=configs,
        world_size=world_size,
        local_world_size=local_world_size,
        global_batch_size=train.global_batch_size,
        device_kind=device_kind,
        constraints=sharding.constraints,
        statistics=statistics,
        topology=topology,
        compute_kernel=sharding.compute_kernel,
        optimizer=optim.sparse,
        dense=dense or DenseFootprint(),
        sharding_group_size=sharding_group_size,
        sync_every=sync_every,
    )
