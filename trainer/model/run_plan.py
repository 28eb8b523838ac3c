"""The plan a run shards by: planned at start (rank 0, the request `shardrec plan` makes of the
job) when no plan file is given, else checked against the job; checked against every rank's device
and host memory; converted to torchrec's ShardingPlan."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist
from torchrec.distributed.types import ShardingPlan
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.dataloader.format.manifest import Manifest
from shardrec.embeddings.managed.table_kinds import TableSettings
from shardrec.sharding.machine.hardware import DeviceMemory, cuda_device_memory, detect_topology
from shardrec.sharding.machine.memory import DenseFootprint
from shardrec.sharding.plan.device_fit import check_plan_fits_devices, check_plan_fits_host
from shardrec.sharding.plan.plan_file import check_kernels_run_on, check_plan, plan_fingerprint
from shardrec.sharding.plan.plan_layout import check_host_size, check_layout
from shardrec.sharding.plan.plan_types import PlanFile
from shardrec.sharding.planner import plan_tables
from shardrec.sharding.search.request import DatasetStatistics
from shardrec.sharding.torchrec.torchrec_plans import to_sharding_plan
from shardrec.trainer.distributed.dist import DistEnv
from shardrec.trainer.job.planning import plan_request
from shardrec.trainer.job.preflight import check_trainable
from shardrec.trainer.job.sections import OptimConfig, ShardingConfig, TrainConfig
from shardrec.trainer.model.objective import TRAIN_EBC_PATH, TRAIN_EC_PATH


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
    job = plan_fingerprint(tables, env.world_size, global_batch_size, env.device.type)
    check_plan(plan, job)
    check_trainable(plan)
    # A direct torchrun's ranks: no `shardrec train` checked the layout (torchrec builds a
    # row-wise table's shards on swapped ranks and buckets ids to the wrong rows).
    check_layout(plan, job.tables, env.world_size)
    check_host_size(plan, env.local_world_size)  # torchrun's nodes, where `shardrec train` is not
    return to_sharding_plan(
        plan,
        tables,
        TRAIN_EBC_PATH,
        env.world_size,
        env.local_world_size,
        env.device.type,
        unpooled_path=TRAIN_EC_PATH,
    )
