"""build_* functions: tables, the model, the sharding plan, the sharded model and its optimizers.

Everything that must not depend on the plan or the world size (initial weights, the order of
random draws) is fixed here, so that two runs that differ only in their plan start equal.
"""

from __future__ import annotations

import logging
import math
from typing import Any
import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec.distributed import comm_ops
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv, ShardingPlan, ShardingType
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.dataloader.format import Manifest
from shardrec.embeddings.tables import build_ebc
from shardrec.sharding.plan_io import PlanFile, check_plan, plan_fingerprint, to_sharding_plan
from shardrec.sharding.planner import plan_tables
from shardrec.sharding.sharders import build_sharders
from shardrec.trainer.dist import DistEnv
from shardrec.trainer.models import build_model
from shardrec.trainer.objective import TRAIN_EBC_PATH, TrainModule
from shardrec.trainer.optim import (
    DENSE_OPTIMIZERS,
    SPARSE_OPTIMIZERS,
    TrainOptimizer,
    attach_fused_optimizer,
    dlrm_schedule,
    optimizer_kwargs,
)
from shardrec.trainer.preflight import check_trainable

logger = logging.getLogger(__name__)

# Embedding weights are drawn in blocks of rows, each from its own seeded generator, so a rank
# draws only the blocks its shards touch and the values do not depend on how tables are cut.
INIT_BLOCK_ROWS = 8192


def build_train_module(
    manifest: Manifest,
    tables: list[EmbeddingBagConfig],
    arch: str,
    dense_arch: list[int],
    over_arch: list[int],
    dcn_layers: int,
    dcn_low_rank: int,
    global_batch_size: int,
    world_size: int,
    seed: int,
    dense_device: torch.device,
) -> TrainModule:
    """The unsharded model (embeddings on the meta device) wrapped with its loss."""
    torch.manual_seed(seed)
    model = build_model(
        arch,
        build_ebc(tables, "meta"),
        [name for t in tables for name in t.feature_names],
        len(manifest.dense_features),
        dense_arch,
        over_arch,
        dcn_layers,
        dcn_low_rank,
        dense_device,
    )
    return TrainModule(model, global_batch_size, world_size)


def plan_at_start(
    tables: list[EmbeddingBagConfig],
    env: DistEnv,
    global_batch_size: int,
    constraints: dict[str, dict[str, Any]],
    compute_kernel: str,
    sparse_optimizer: str,
    manifest: Manifest,
) -> PlanFile:
    """Plan with shardrec's planner when no plan file is given, with what `shardrec plan` would
    use for this job (kernel, optimizer, constraints, statistics): rank 0 plans, every rank gets it."""
    from shardrec.sharding.request import DatasetStatistics

    holder: list[PlanFile | None] = [None]
    if env.rank == 0:
        holder[0] = plan_tables(
            tables,
            world_size=env.world_size,
            local_world_size=env.local_world_size,
            global_batch_size=global_batch_size,
            device_kind=env.device.type,
            constraints=constraints,
            statistics=DatasetStatistics.from_manifest(manifest),
            compute_kernel=compute_kernel,
            optimizer=sparse_optimizer,
        )
    if dist.is_initialized() and env.world_size > 1:
        dist.broadcast_object_list(holder, src=0)
    assert holder[0] is not None
    return holder[0]


def build_sharding_plan(plan: PlanFile, tables: list[EmbeddingBagConfig], env: DistEnv, global_batch_size: int) -> ShardingPlan:
    """Check a plan file against this job (StalePlanError says what differs) and convert it."""
    check_plan(plan, plan_fingerprint(tables, env.world_size, global_batch_size, env.device.type))
    check_trainable(plan)
    return to_sharding_plan(plan, tables, TRAIN_EBC_PATH, env.world_size, env.local_world_size, env.device.type)


def shard_model(
    module: TrainModule,
    plan: ShardingPlan,
    env: DistEnv,
    sparse_optimizer: str,
    sparse_lr: float,
    eps: float,
    qcomm: str | None,
) -> DistributedModelParallel:
    """Shard the embeddings by `plan`, fusing the sparse optimizer into every fused-kernel table."""
    # trainer.objective's loss scaling relies on torchrec averaging sharded gradients.
    assert comm_ops.get_gradient_division(), "torchrec gradient division was turned off"
    module_plan = plan.plan[TRAIN_EBC_PATH]
    ebc = module.model.sparse_arch.embedding_bag_collection
    fused = []
    for name, bag in ebc.embedding_bags.items():
        sharding = module_plan[name]  # type: ignore[index]
        if sharding.compute_kernel == "fused":
            fused.append(bag.weight)
        elif sharding.sharding_type != ShardingType.DATA_PARALLEL.value:
            # Their gradients arrive summed, not through DDP; TrainOptimizer only handles the latter.
            raise ValueError(f"table {name}: compute_kernel {sharding.compute_kernel!r} is supported for data_parallel tables only; use fused")
    if fused:
        attach_fused_optimizer(fused, sparse_optimizer, sparse_lr, eps)
    return DistributedModelParallel(
        module,
        env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),
        device=env.device,
        plan=plan,
        sharders=build_sharders(qcomm_precision=qcomm),  # type: ignore[arg-type]
    )


def _block_seed(seed: int, table_index: int, block: int) -> int:
    return (seed * 1_000_003 + table_index * 7_919 + block) % (2**63 - 1)


def _fill_rows(out: torch.Tensor, row0: int, col0: int, table_index: int, config: EmbeddingBagConfig, seed: int) -> None:
    """Write rows [row0, row0 + len(out)) x cols [col0, col0 + width) of the table's initial weights."""
    bound = math.sqrt(1.0 / config.num_embeddings)
    rows, cols = out.shape
    first, last = row0 // INIT_BLOCK_ROWS, (row0 + rows - 1) // INIT_BLOCK_ROWS
    for block in range(first, last + 1):
        start = block * INIT_BLOCK_ROWS
        size = min(INIT_BLOCK_ROWS, config.num_embeddings - start)
        gen = torch.Generator().manual_seed(_block_seed(seed, table_index, block))
        values = torch.empty(size, config.embedding_dim).uniform_(-bound, bound, generator=gen)
        lo, hi = max(start, row0), min(start + size, row0 + rows)
        out[lo - row0 : hi - row0].copy_(values[lo - start : hi - start, col0 : col0 + cols])


@torch.no_grad()
def init_embedding_weights(model: torch.nn.Module, tables: list[EmbeddingBagConfig], seed: int) -> None:
    """Give every table the same initial weights whatever the plan: each rank fills its shards."""
    state = model.state_dict()
    for index, config in enumerate(tables):
        weight = state[f"{TRAIN_EBC_PATH}.embedding_bags.{config.name}.weight"]
        if isinstance(weight, ShardedTensor):
            for shard in weight.local_shards():
                row0, col0 = shard.metadata.shard_offsets
                _fill_rows(shard.tensor, row0, col0, index, config, seed)
        else:
            _fill_rows(weight, 0, 0, index, config, seed)


def build_optimizer(
    model: DistributedModelParallel,
    dense_optimizer: str,
    dense_lr: float,
    sparse_optimizer: str,
    sparse_lr: float,
    eps: float,
    warmup_steps: int,
    decay_start: int,
    decay_steps: int,
) -> TrainOptimizer:
    """The after-backward optimizer: dense layers (scheduled) and data-parallel tables, if any."""
    dense, tables = [], {}
    for name, param in model.named_parameters():
        if hasattr(param, "_in_backward_optimizers"):
            continue
        if ".embedding_bags." in name:
            tables[name] = (name.split(".embedding_bags.")[1].split(".")[0], param)
        else:
            dense.append(param)
    dense_opt = DENSE_OPTIMIZERS[dense_optimizer](dense, **optimizer_kwargs(dense_optimizer, dense_lr, eps))
    table_opt = None
    if tables:
        params = [p for _, p in tables.values()]
        table_opt = SPARSE_OPTIMIZERS[sparse_optimizer](params, **optimizer_kwargs(sparse_optimizer, sparse_lr, eps))
    return TrainOptimizer(dense_opt, table_opt, tables, dlrm_schedule(warmup_steps, decay_start, decay_steps))
