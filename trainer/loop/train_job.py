"""One rank's training job: the parts built by trainer.model.build, wired once (`build_job`),
and what its checkpoints hold. job_run.run_job runs it.

Called by `python -m shardrec.trainer` (the torchrun entry) on every rank.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.dataloader.format.fingerprints import dataset_fingerprint, older_fingerprints
from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.loader import NO_SHUFFLE, BatchLoader, ShuffleSpec, build_loader
from shardrec.dataloader.util.files import atomic_write_bytes
from shardrec.embeddings.dims import job_tables
from shardrec.embeddings.init import init_embedding_weights
from shardrec.embeddings.table_batches import host_placement, table_batches
from shardrec.sharding.plan.plan_file import load_plan, save_plan
from shardrec.sharding.plan.plan_types import PlanFile
from shardrec.trainer.distributed.dist import DistEnv
from shardrec.trainer.distributed.stop import StopAgreement, StopRequest
from shardrec.trainer.job import data_options
from shardrec.trainer.job.config import JobConfig
from shardrec.trainer.job.model_section import ModelConfig
from shardrec.trainer.job.preflight import check_against_dataset
from shardrec.trainer.job.sections import SEED_UNSET, OptimConfig
from shardrec.trainer.loop.managed_ids import (
    ManagedIds,
    build_managed_ids,
    check_managed_kernels,
)
from shardrec.trainer.loop.steps import StepRunner
from shardrec.trainer.model import build
from shardrec.trainer.model.hstu_model import HSTUModel
from shardrec.trainer.model.models import finite_stages
from shardrec.trainer.model.objective import TRAIN_EBC_PATH, TRAIN_EC_PATH
from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.checkpoint.manager import CheckpointManager
from shardrec.trainer.rundir.checkpoint.parts import CheckpointParts, ModuleState, TrainProgress
from shardrec.trainer.rundir.checkpoint.signature import checkpoint_signature as signature_of
from shardrec.trainer.rundir.checkpoint.signature import ensure_run_id, read_run_id
from shardrec.trainer.rundir.id_map_state import IdMapsState
from shardrec.trainer.rundir.life import resume_settings, trained_data
from shardrec.trainer.rundir.life.initial_weights import InitialWeights, record_initial_weights
from shardrec.trainer.rundir.life.stretches import kept_stretch_steps, read_stretches
from shardrec.trainer.rundir.mllog import MlperfLog, benchmark_of, log_init
from shardrec.trainer.rundir.optim_state import PART, SparseOptimizerState

logger = logging.getLogger(__name__)


@dataclass
class Job:
    """Everything a rank trains with, built once."""

    config: JobConfig
    env: DistEnv
    run_dir: Path
    plan: PlanFile
    model: torch.nn.Module
    runner: StepRunner
    train_loader: BatchLoader
    eval_loaders: dict[str, BatchLoader]
    checkpoints: CheckpointManager
    progress: TrainProgress
    """The step and epoch; the checkpoints save and restore this same object."""
    stop: StopAgreement
    """Whether the ranks were asked to stop (SIGTERM / SIGINT): they then checkpoint and leave."""
    manifest: Manifest | None = None
    """The dataset's manifest (its fingerprint goes into RUN/dataset.json)."""
    mllog: MlperfLog = field(default_factory=lambda: MlperfLog(False))
    """MLPerf's events (train.mlperf_log, rank 0), its init phase logged while the job was built."""
    managed: ManagedIds | None = None
    """The raw-id tables' id maps (None: the job has none)."""
    continuing: bool = False
    """The job starts a new stretch of its run on other data (`--continue-on`): it loads the run's
    last checkpoint but its loader position, and evaluates the new data before training on it."""


def checkpoint_signature(
    model: ModelConfig,
    optim: OptimConfig,
    tables: list[EmbeddingBagConfig],
    dataset: str = "",
    older_datasets: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The signature (trainer.rundir.checkpoint.signature.checkpoint_signature) of a job of these
    tables."""
    shapes = [(t.name, t.num_embeddings, t.embedding_dim) for t in tables]
    return signature_of(model, optim, shapes, dataset, older_datasets)


def checkpoint_parts(
    *,
    plan: PlanFile,
    model: torch.nn.Module,
    runner: StepRunner,
    train_loader: BatchLoader,
    progress: TrainProgress,
    signature: dict[str, Any],
    managed: ManagedIds | None = None,
    is_main: bool = True,
) -> CheckpointParts:
    """What a checkpoint of this job holds, under the names train_state.pt and the DCP files use
    (the managed tables' id maps under "id_maps", only in a job that has them)."""
    main: dict[str, Any] = {"optimizer": runner.optimizer, "loader": train_loader}
    json_files: dict[str, Callable[[], dict[str, Any]]] = {}
    if managed is not None:
        id_maps = IdMapsState(managed.maps, managed.group, is_main, managed.counts)
        main["id_maps"] = id_maps
        json_files[names.ID_MAP_SCHEDULE] = id_maps.schedule
    return CheckpointParts(
        progress=progress,
        sharded={
            "model": ModuleState(model),
            PART: SparseOptimizerState(model.fused_optimizer, runner.optimizer, plan),
        },
        main=main,
        signature=signature,
        layout=plan.to_json(),
        json_files=json_files,
    )


def with_run_seed(config: JobConfig, env: DistEnv, run_dir: Path) -> JobConfig:
    """The job with the seed this run uses: the job's; or, unset, the run's own on a resume
    (config.toml, which every rank reads before rank 0 can rewrite it), else 0, or where
    train.mlperf_log one drawn from the OS by rank 0 and shared with every rank (MLPerf seeds each
    run from the clock or the OS)."""
    t = config.train
    if t.seed != SEED_UNSET:
        return config
    recorded = resume_settings.recorded_seed(run_dir)
    if recorded is not None and recorded != SEED_UNSET:
        seed, how = recorded, "the run's"
    elif t.mlperf_log:
        drawn = [int.from_bytes(os.urandom(4), "little") >> 1 if env.rank == 0 else 0]
        if dist.is_initialized() and env.world_size > 1:
            dist.broadcast_object_list(drawn, src=0)
        seed, how = drawn[0], "drawn from the OS"
    else:
        seed, how = 0, "the default"
    if env.is_main and t.mlperf_log:
        logger.info("train.seed = %d (%s)", seed, how)
    return dataclasses.replace(config, train=dataclasses.replace(t, seed=int(seed)))


def build_job(
    config: JobConfig,
    env: DistEnv,
    run_dir: Path,
    plan_path: str | None,
    stop: StopRequest | None = None,
    continuing: bool = False,
) -> Job:
    """Model, plan, sharding, optimizers, loaders and checkpoints for this rank; `stop` is this
    rank's stop request (default: the launcher's stop file only, no signal handlers);
    `continuing`: the job starts a new stretch of the run in `run_dir` on its data
    (trainer.rundir.life.continuation)."""
    config = with_run_seed(config, env, run_dir)
    t, o = config.train, config.optim
    mllog = MlperfLog(t.mlperf_log and env.is_main, benchmark_of(config.model))
    platform = f"{env.world_size}x{env.device.type}"
    log_init(
        mllog,
        submission=t.mlperf_submission,
        platform=platform,
        global_batch_size=t.global_batch_size,
        seed=t.seed,
        optim=o,
        model=config.model,
        evaluation=config.eval,
    )
    data_dir = Path(config.data.path)
    manifest = Manifest.load(data_dir)
    # With on-the-fly multi-hot ids the tables have the index tables' rows (data_options).
    seen, multihot = (
        data_options.model_manifest(manifest, config.data),
        data_options.multihot_option(config.data),
    )
    model, tables, plan = build.build_sharded_model(
        seen,
        env,
        model_config=config.model,
        train=t,
        optim=o,
        sharding=config.sharding,
        plan=load_plan(plan_path) if plan_path else None,
        plan_source=plan_path or "",
        table_settings=config.tables,
        # A resume plans the maps for the update spacing its stretch keeps (the checkpoint's,
        # as ManagedMaps does), not for the steps it trains now.
        stretch_steps=(None if continuing else kept_stretch_steps(run_dir))
        or data_options.train_steps(manifest, config.data, t),
    )
    if env.is_main:  # where the kernels keep what the plan put in host memory
        for tbe in table_batches(model.fused_optimizer):
            placed = host_placement(tbe)
            if placed:
                logger.info("rank 0: %s", placed)
    init_embedding_weights(model, tables, t.seed, ebc_path=TRAIN_EBC_PATH, ec_path=TRAIN_EC_PATH)
    optimizer = build.build_optimizer(model, tables, o)
    # MLPerf's clock starts before anything reads the dataset beyond its manifest (README, DLRMv2):
    # the loaders below open its files.
    mllog.end("init_stop")
    mllog.start("run_start")
    train_loader = build_loader(
        data_dir,
        config.data.train_split,
        global_batch_size=t.global_batch_size,
        rank=env.rank,
        world_size=env.world_size,
        shuffle=ShuffleSpec(enabled=config.data.shuffle, seed=t.seed),
        tail=config.data.tail,
        delivery=data_options.delivery(config.data, env.device.type),
        multihot=multihot,
    )
    eval_batch = config.eval.batch_size or t.global_batch_size
    check_against_dataset(config, seen)
    eval_loaders = {
        split: build_loader(
            data_dir,
            split,
            global_batch_size=eval_batch,
            rank=env.rank,
            world_size=env.world_size,
            shuffle=NO_SHUFFLE,
            tail="pad",
            delivery=data_options.delivery(config.data, env.device.type),
            multihot=multihot,
        )
        for split in config.data.eval_splits
        if split in manifest.splits and manifest.splits[split].rows > 0
    }
    # What each step's finite flags are about, in the model's forward order (a NaN loss names it).
    hstu = next((m for m in model.modules() if isinstance(m, HSTUModel)), None)
    if hstu is not None:
        stages = hstu.finite_stages(seen.dense_features)
    else:
        stages = finite_stages(seen.dense_features, [n for t in tables for n in t.feature_names])
    runner = StepRunner(model, optimizer, env.device, t.pipeline, stages)
    progress = TrainProgress()
    check_managed_kernels(
        job_tables(manifest, config.tables), {t.name: t.compute_kernel for t in plan.tables}
    )
    managed = build_managed_ids(
        job_tables(manifest, config.tables),
        tables,
        model,
        optimizer,
        ebc_path=TRAIN_EBC_PATH,
        ec_path=TRAIN_EC_PATH,
        seed=t.seed,
        stretch_steps=t.total_steps(len(train_loader)),
        timeout_s=config.dist.timeout_s,
    )
    fingerprint = dataset_fingerprint(manifest)
    signature = checkpoint_signature(
        config.model, config.optim, tables, fingerprint, older_fingerprints(manifest)
    )
    # Every rank reads it here, before the collectives that rank 0 passes before writing it.
    signature["run"] = read_run_id(run_dir)
    if continuing:  # the last checkpoint is of the previous stretch's data
        previous = (trained_data.read_dataset_record(run_dir) or {}).get("fingerprint", "")
        if previous in (
            fingerprint,
            *older_fingerprints(manifest),
        ):  # this stretch began before, stopped before its checkpoint
            previous = read_stretches(run_dir)[-2].fingerprint
        signature["continues_from"] = previous
    parts = checkpoint_parts(
        plan=plan,
        model=model,
        runner=runner,
        train_loader=train_loader,
        progress=progress,
        signature=signature,
        managed=managed,
        is_main=env.is_main,
    )
    keep, timeout_s = config.checkpoint.keep, config.checkpoint.timeout_s
    checkpoints = CheckpointManager(
        run_dir / names.CHECKPOINTS, env, keep=keep, parts=parts, timeout_s=timeout_s
    )
    # Each stretch's last checkpoint stays: a run that goes on keeps one per day.
    checkpoints.kept_steps = {s.last_step for s in read_stretches(run_dir) if s.last_step}
    return Job(
        config=config,
        env=env,
        run_dir=run_dir,
        plan=plan,
        model=model,
        runner=runner,
        train_loader=train_loader,
        eval_loaders=eval_loaders,
        checkpoints=checkpoints,
        progress=progress,
        stop=StopAgreement(stop or StopRequest()),
        manifest=manifest,
        mllog=mllog,
        managed=managed,
        continuing=continuing,
    )


def write_run_files(job: Job, drew: bool = False) -> None:
    """The run directory keeps the resolved config and the plan it ran with (rank 0); `drew`: the
    job trains from the initial weights it drew (no checkpoint loaded), which device drew them."""
    if not job.env.is_main:
        return
    job.run_dir.mkdir(parents=True, exist_ok=True)
    # data.path and sharding.plan as absolute paths, so that eval, export and --continue-on find
    # them from any directory; dataset.json keeps the data's path as given too.
    saved = resume_settings.with_absolute_paths(job.config)
    atomic_write_bytes(job.run_dir / names.CONFIG, saved.to_toml().encode())
    # Rank 0 writes train_state.pt, so its signature carries the id (a new run's, from now on).
    job.checkpoints.parts.signature["run"] = ensure_run_id(job.run_dir)
    if job.manifest is not None:
        record = trained_data.dataset_record(
            saved.data.path, job.manifest, given=job.config.data.path
        )
        atomic_write_bytes(job.run_dir / names.DATASET_RECORD, record)
    save_plan(job.plan, job.run_dir / names.PLAN)
    if drew:
        drawn = InitialWeights(job.env.device.type, job.config.train.seed, torch.__version__)
        record_initial_weights(job.run_dir, drawn)
