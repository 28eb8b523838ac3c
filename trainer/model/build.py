"""build_* functions of the trainer: the model with its loss, the sharding plan, the sharded model
and its after-backward optimizer. The tables themselves, their initial weights and the sparse
optimizer are shardrec.embeddings'.

The dense layers' initial weights are drawn here, before sharding, from a seeded global RNG, so
that two runs that differ only in their plan or world size start equal (the tables' weights are
plan-independent by construction: shardrec.embeddings.init).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping

import torch
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
from shardrec.embeddings.tables import build_ebc, build_table_configs
from shardrec.sharding.machine.hardware import DeviceMemory, cuda_device_memory, detect_topology
from shardrec.sharding.machine.memory import DenseFootprint, dense_footprint
from shardrec.sharding.plan.device_fit import check_plan_fits_devices, check_plan_fits_host
from shardrec.sharding.plan.plan_file import check_kernels_run_on, check_plan, plan_fingerprint
from shardrec.sharding.plan.plan_types import PlanFile
from shardrec.sharding.planner import plan_tables
from shardrec.sharding.search.request import DatasetStatistics
from shardrec.sharding.torchrec.sharders import (
    FUSED_KERNELS,
    build_sharders,
    plan_fused_params,
)
from shardrec.sharding.torchrec.torchrec_plans import to_sharding_plan
from shardrec.trainer.distributed.dist import DistEnv
from shardrec.trainer.job.config import ModelConfig, OptimConfig, ShardingConfig, TrainConfig
from shardrec.trainer.job.planning import plan_request
from shardrec.trainer.job.precision import check_precision, resolve_precision
from shardrec.trainer.job.preflight import check_trainable
from shardrec.trainer.model.hstu_model import build_hstu_model
from shardrec.trainer.model.models import build_model, dense_parameters, resolve_compile
from shardrec.trainer.model.objective import TRAIN_EBC_PATH, TRAIN_EC_PATH, TrainModule
from shardrec.trainer.model.train_optimizer import (
    TrainOptimizer,
    build_dense_optimizer,
    dlrm_schedule,
)

logger = logging.getLogger(__name__)


def build_train_module(
    model_config: ModelConfig,
    manifest: Manifest,
    tables: list[EmbeddingBagConfig],
    env: DistEnv,
    *,
    global_batch_size: int,
    seed: int,
    precision: str = "fp32",
    allow_emulated_bf16: bool = False,
    compile_setting: str = "off",
    sequence_dedup: bool = False,
    loss_weight: float = 1.0,
) -> TrainModule:
    """The unsharded model (embeddings on the meta device, dense layers on `env.device`) wrapped
    with its loss; `seed` seeds the dense layers' initial weights; `precision`, `compile_setting`
    and `allow_emulated_bf16` are train.precision, train.compile and train.allow_emulated_bf16;
    `sequence_dedup` (HSTU) sends each table's distinct ids only. ValueError for bf16 on a device
    that only emulates it, unless allowed (the slowdown is measured and said)."""
    if model_config.arch == "hstu":
        return _hstu_train_module(
            model_config,
            manifest,
            tables,
            env,
            global_batch_size=global_batch_size,
            seed=seed,
            precision=precision,
            compile_setting=compile_setting,
            sequence_dedup=sequence_dedup,
            loss_weight=loss_weight,
        )
    device_type = env.device.type
    resolved = resolve_precision(precision, device_type)
    note = check_precision(resolved, device_type, allow_emulated_bf16)
    if env.is_main and note:
        logger.warning(note)
    if env.is_main and precision == "auto":
        logger.info("train.precision = auto: %s on this %s", resolved, device_type)
    torch.manual_seed(seed)
    model = build_model(
        model_config,
        build_ebc(tables, "meta"),
        [name for t in tables for name in t.feature_names],
        len(manifest.dense_features),
        dense_device=env.device,
        precision=resolved,
    )
    if resolve_compile(compile_setting, device_type, dense_parameters(model)):
        if env.is_main:
            logger.info("compiling the dense layers and the interaction (train.compile)")
        model.compile_dense(fall_back=compile_setting == "auto")
    return TrainModule(model, global_batch_size, env.world_size, loss_weight)


def _hstu_train_module(
    model_config: ModelConfig,
    manifest: Manifest,
    tables: list[EmbeddingBagConfig],
    env: DistEnv,
    *,
    global_batch_size: int,
    seed: int,
    precision: str,
    compile_setting: str,
    sequence_dedup: bool,
    loss_weight: float,
) -> TrainModule:
    """HSTU's train module: fp32 (train.precision auto means fp32 here), not compiled."""
    if precision not in ("fp32", "auto"):
        raise ValueError(f'train.precision = "{precision}": HSTU trains in fp32 here (use "fp32")')
    if compile_setting == "on":
        raise ValueError(
            'train.compile = "on": HSTU\'s layers are not compiled (use "auto" or "off")'
        )
    torch.manual_seed(seed)
    with torch.device(env.device):  # the dense layers; the tables stay on the meta device
        hstu = build_hstu_model(
            model_config,
            tables,
            manifest.sparse_features,
            len(manifest.dense_features),
            dedup=sequence_dedup,
        )
    return TrainModule(hstu, global_batch_size, env.world_size, loss_weight)


def plan_at_start(
    tables: list[EmbeddingBagConfig],
    manifest: Manifest,
    env: DistEnv,
    *,
    train: TrainConfig,
    sharding: ShardingConfig,
    optim: OptimConfig,
    dense: DenseFootprint | None = None,
    devices: list[DeviceMemory] | None = None,
    table_settings: Mapping[str, TableSettings] | None = None,
    stretch_steps: int = 0,
) -> PlanFile:
    """Plan with shardrec's planner when no plan file is given, with the request `shardrec plan`
    makes of this job (trainer.job.planning): rank 0 plans, every rank gets it. On CUDA,
    `devices` (every rank's, gather_devices) make the topology: their model and free memory."""
    holder: list[PlanFile | None] = [None]
    if env.rank == 0:
        topology = (
            detect_topology(env.world_size, env.local_world_size, devices=devices)
            if devices
            else None
        )
        request = plan_request(
            tables,
            DatasetStatistics.from_manifest(manifest),
            train=train,
            sharding=sharding,
            optim=optim,
            world_size=env.world_size,
            local_world_size=env.local_world_size,
            device_kind=env.device.type,
            topology=topology,
            dense=dense,
            tables=table_settings,
            stretch_steps=stretch_steps,
        )
        holder[0] = plan_tables(request)
    if dist.is_initialized() and env.world_size > 1:
        dist.broadcast_object_list(holder, src=0)
    assert holder[0] is not None
    return holder[0]


def gather_devices(env: DistEnv) -> list[DeviceMemory] | None:
    """Every rank's CUDA device with its free memory, in rank order (one all_gather_object: each
    rank asks only its own device, opening no context on another's); None on CPU."""
    if env.device.type != "cuda":
        return None
    own = cuda_device_memory(
        env.device.index if env.device.index is not None else torch.cuda.current_device()
    )
    if not (dist.is_initialized() and env.world_size > 1):
        return [own]
    gathered: list[DeviceMemory | None] = [None] * env.world_size
    dist.all_gather_object(gathered, own)
    return [d for d in gathered if d is not None]


def check_plan_fits(plan: PlanFile, devices: list[DeviceMemory] | None, env: DistEnv) -> None:
    """Refuse a plan whose estimate for a rank exceeds its device's free memory, or whose UVM
    tables exceed their host's available memory (CUDA; a no-op on CPU)."""
    if not devices:
        return
    lws = env.local_world_size
    names = [f"cuda:{rank % lws}, {d.name}" for rank, d in enumerate(devices)]
    check_plan_fits_devices(plan, [d.free_bytes for d in devices], env.device.type, names)
    check_plan_fits_host(plan, [d.host_available_bytes for d in devices], lws)


def build_sharding_plan(
    plan: PlanFile, tables: list[EmbeddingBagConfig], env: DistEnv, global_batch_size: int
) -> ShardingPlan:
    """Check a plan file against this job (StalePlanError says what differs) and convert it."""
    check_kernels_run_on(
        plan, env.device.type
    )  # before the fingerprint: it says why and what to do
    check_plan(plan, plan_fingerprint(tables, env.world_size, global_batch_size, env.device.type))
    check_trainable(plan)
    return to_sharding_plan(
        plan,
        tables,
        TRAIN_EBC_PATH,
        env.world_size,
        env.local_world_size,
        env.device.type,
        unpooled_path=TRAIN_EC_PATH,
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
    return DistributedModelParallel(
        module,
        env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),
        device=env.device,
        plan=plan,
        sharders=trainer_sharders(qcomm, plan_file),  # type: ignore[arg-type]
    )


def build_sharded_model(
    manifest: Manifest,
    env: DistEnv,
    *,
    model_config: ModelConfig,
    train: TrainConfig,
    optim: OptimConfig,
    sharding: ShardingConfig,
    plan: PlanFile | None = None,
    table_settings: Mapping[str, TableSettings] | None = None,
    stretch_steps: int = 0,
) -> tuple[DistributedModelParallel, list[EmbeddingBagConfig], PlanFile]:
    """The tables, the train module, its plan (planned at start when none is given, else checked
    against this job) and the sharded model; training and evaluation build it alike. The embedding
    weights are not initialised here (a checkpoint or init_embedding_weights fills them).
    `table_settings` are the job's `[tables.FEATURE]` (a raw-id feature's kind and rows)."""
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
    if plan is None:
        plan = plan_at_start(
            tables,
            manifest,
            env,
            train=train,
            sharding=sharding,
            optim=optim,
            dense=dense_footprint(module, optim.dense),
            devices=devices,
            table_settings=table_settings,
            stretch_steps=stretch_steps,
        )
    sharding_plan = build_sharding_plan(plan, tables, env, train.global_batch_size)
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
