"""build_* functions of the trainer: the sharded model and its after-backward optimizer, from the
train module (train_module.py) and the plan (run_plan.py). The tables themselves, their initial
weights and the sparse optimizer are shardrec.embeddings'.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import torch.distributed as dist
from torchrec.distributed import comm_ops
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import BoundsCheckMode, ShardingEnv, ShardingPlan, ShardingType
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.optim.optimizers import in_backward_optimizer_filter

from shardrec.dataloader.format.manifest import Manifest
from shardrec.embeddings.dims import job_tables
from shardrec.embeddings.managed.table_kinds import TableSettings
from shardrec.embeddings.optim import (
    attach_fused_optimizer,
    replicated_table_optimizer,
    replicated_table_params,
)
from shardrec.embeddings.tables import build_table_configs
from shardrec.sharding.machine.memory import dense_footprint
from shardrec.sharding.plan.plan_file import check_estimate_dense
from shardrec.sharding.plan.plan_types import PlanFile
from shardrec.sharding.torchrec.sharders import (
    FUSED_KERNELS,
    build_sharders,
    plan_fused_params,
)
from shardrec.trainer.distributed.dense_reduce import sum_in_rank_order
from shardrec.trainer.distributed.dist import DistEnv
from shardrec.trainer.job.model_section import ModelConfig
from shardrec.trainer.job.sections import OptimConfig, ShardingConfig, TrainConfig
from shardrec.trainer.model.objective import TRAIN_EBC_PATH, TRAIN_EC_PATH, TrainModule
from shardrec.trainer.model.run_plan import (
    build_sharding_plan,
    check_plan_fits,
    gather_devices,
    plan_at_start,
)
from shardrec.trainer.model.train_module import build_train_module
from shardrec.trainer.model.train_optimizer import (
    TrainOptimizer,
    build_dense_optimizer,
    dlrm_schedule,
)


def trainer_sharders(qcomm: str | None, plan: PlanFile | None = None) -> list:
    """The sharders the trainer shards with. fbgemm's kernels check every id against its table:
    FATAL stops the step (an exception on CPU, a device-side assert on CUDA) where fbgemm's
    default logs once and trains row 0 in the id's place. The loader refuses such ids first
    (dataloader/gather/batch.py); this covers any other way a bad id arrives. Kept on CUDA too: its
    check costs one small kernel per batch, and a rank hit by the assert ends at once
    (rank_process.exit_after_cuda_failure), so torchrun stops the others instead of them
    waiting in a collective for dist.timeout_s. `plan` adds what its tables need of the sharders
    (sharding.sharders.plan_fused_params: one TBE per cached table)."""
    fused_params: dict = {"bounds_check_mode": BoundsCheckMode.FATAL}
    if plan is not None:
        fused_params = plan_fused_params(plan, fused_params)
    return build_sharders(fused_params=fused_params, qcomm_precision=qcomm)


def quiet_dense_lookup_warning() -> None:
    """Hide torch's warning that backprop through fbgemm's dense (data-parallel) lookup "may lead
    to silently incorrect behavior", and nothing else.

    The op has no autograd kernel of its own, so torch's fallback warns on every backward; the
    gradients are right all the same: tests/distributed/test_train_distributed.py trains
    data-parallel tables against table-wise ones (and full Adagrad against torch.optim.Adagrad on
    the data-parallel table) and they end within its tolerance. Only that op's message is
    filtered: the same warning about any other op still shows."""
    warnings.filterwarnings(
        "ignore",
        message=r"fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel was not "
        r"registered",
        category=UserWarning,
    )


def shard_model(
    module: TrainModule,
    plan: ShardingPlan,
    env: DistEnv,
    optim: OptimConfig,
    *,
    qcomm: str | None,
    plan_file: PlanFile | None = None,
) -> DistributedModelParallel:
    """Shard the embeddings by `plan`, fusing the sparse optimizer into every fused-kernel table
    (fused, and on CUDA the UVM kernels); `plan_file` is the plan's file, for its sharders'
    needs."""
    # trainer.model.objective's loss scaling relies on torchrec averaging sharded gradients.
    assert comm_ops.get_gradient_division(), "torchrec gradient division was turned off"
    arch = module.model.sparse_arch
    for path, collection in (
        (TRAIN_EBC_PATH, arch.embedding_bag_collection),
        (TRAIN_EC_PATH, getattr(arch, "embedding_collection", None)),
    ):
        if collection is None:
            continue
        module_plan = plan.plan[path]
        tables = collection.embedding_bags if path == TRAIN_EBC_PATH else collection.embeddings
        fused = []
        for name in tables:
            sharding = module_plan[name]  # type: ignore[index]
            if sharding.sharding_type == ShardingType.DATA_PARALLEL.value:
                quiet_dense_lookup_warning()
            if sharding.compute_kernel in FUSED_KERNELS:
                fused.append(name)
            elif sharding.sharding_type != ShardingType.DATA_PARALLEL.value:
                # Their gradients arrive summed, not through DDP; TrainOptimizer only handles the
                # latter.
                raise ValueError(
                    f"table {name}: compute_kernel {sharding.compute_kernel!r} is supported "
                    f"for data_parallel tables only; use one of {', '.join(FUSED_KERNELS)}"
                )
        attach_fused_optimizer(
            collection, fused, optimizer=optim.sparse, lr=optim.sparse_lr, eps=optim.eps
        )
    model = DistributedModelParallel(
        module,
        env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),
        device=env.device,
        plan=plan,
        sharders=trainer_sharders(qcomm, plan_file),  # type: ignore[arg-type]
    )
    sum_in_rank_order(model)  # 3+ CPU ranks: a resume bit for bit (dense_reduce.py)
    return model


def build_sharded_model(
    manifest: Manifest,
    env: DistEnv,
    *,
    model_config: ModelConfig,
    train: TrainConfig,
    optim: OptimConfig,
    sharding: ShardingConfig,
    plan: PlanFile | None = None,
    plan_source: str = "",
    table_settings: Mapping[str, TableSettings] | None = None,
    stretch_steps: int = 0,
) -> tuple[DistributedModelParallel, list[EmbeddingBagConfig], PlanFile]:
    """The tables, the train module, its plan (planned at start when none is given, else checked
    against this job) and the sharded model; training and evaluation build it alike. The embedding
    weights are not initialised here (a checkpoint or init_embedding_weights fills them).
    `table_settings` are the job's `[tables.FEATURE]` (a raw-id feature's kind and rows);
    `plan_source` the file `plan` was read from, which its refusals name."""
    table_settings = job_tables(manifest, table_settings)
    tables = build_table_configs(
        manifest,
        model_config.embedding_dim,
        model_config.dims,
        table_settings,
        unpooled_sequences=model_config.arch == "hstu",
    )
    module = build_train_module(
        model_config,
        manifest,
        tables,
        env,
        global_batch_size=train.global_batch_size,
        seed=train.fixed_seed,
        precision=train.precision,
        allow_emulated_bf16=train.allow_emulated_bf16,
        compile_setting=train.compile,
        sequence_dedup=sharding.sequence_dedup,
        loss_weight=optim.loss_weight,
    )
    devices = gather_devices(env)
    dense = dense_footprint(module, optim.dense)
    if plan is None:
        plan = plan_at_start(
            tables,
            manifest,
            env,
            train=train,
            sharding=sharding,
            optim=optim,
            dense=dense,
            devices=devices,
            table_settings=table_settings,
            stretch_steps=stretch_steps,
        )
        sharding_plan = build_sharding_plan(plan, tables, env, train.global_batch_size)
    else:
        # A direct torchrun's ranks check the file as `shardrec train` does: its name leads.
        try:
            check_estimate_dense(plan, dense.param_bytes)
            sharding_plan = build_sharding_plan(plan, tables, env, train.global_batch_size)
        except ValueError as e:
            raise ValueError(f"{plan_source or sharding.plan or 'the plan'}: {e}") from None
    check_plan_fits(plan, devices, env)  # before sharding allocates any table
    model = shard_model(
        module, sharding_plan, env, optim, qcomm=sharding.qcomm or None, plan_file=plan
    )
    return model, tables, plan


def build_optimizer(
    model: DistributedModelParallel, tables: list[EmbeddingBagConfig], optim: OptimConfig
) -> TrainOptimizer:
    """The after-backward optimizer: dense layers (scheduled) and data-parallel tables, if any
    (scheduled with the fused tables when `optim.schedule_tables`).

    Parameters with a fused optimizer (the sharded tables) are left out; of the rest, the
    tables' weights are found by name (shardrec.embeddings.optim), everything else is dense.
    """
    replicated = replicated_table_params(model, tables, TRAIN_EBC_PATH, TRAIN_EC_PATH)
    after_backward = in_backward_optimizer_filter(model.named_parameters(), include=False)
    dense = [p for fqn, p in after_backward if fqn not in replicated]
    dense_opt = build_dense_optimizer(
        dense,
        optimizer=optim.dense,
        lr=optim.dense_lr,
        eps=optim.eps,
        betas=(optim.adam_beta1, optim.adam_beta2),
    )
    table_opt = None
    if replicated:
        params = [p for _, p in replicated.values()]
        table_opt = replicated_table_optimizer(
            params, optimizer=optim.sparse, lr=optim.sparse_lr, eps=optim.eps
        )
    schedule = dlrm_schedule(
        optim.warmup_steps, optim.decay_start, optim.decay_steps, optim.warmup_from_zero
    )
    fused = model.fused_optimizer if optim.schedule_tables else None
    return TrainOptimizer(dense_opt, table_opt, replicated, schedule, fused, optim.clip_grad_norm)
