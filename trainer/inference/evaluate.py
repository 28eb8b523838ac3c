"""`shardrec eval`: a run's checkpoint evaluated on a split, at any world size.

The model is built the way training built it (trainer.loop.train_job: same tables, dense layers and
sharding code) and only its weights are read from the checkpoint (DCP reshards them onto this
world size's plan). At the run's own world size the run's plan is reused, and the evaluation
loader is the one training evaluated with (same batch, order, padding, cap), so the AUC equals
the run's own evaluation of that step bit for bit.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from shardrec.dataloader.format.fingerprints import dataset_fingerprint, older_fingerprints
from shardrec.dataloader.loader import NO_SHUFFLE, BatchLoader, build_loader
from shardrec.embeddings.dims import job_tables
from shardrec.embeddings.sparse_optimizers import sparse_optimizer
from shardrec.sharding.plan.plan_file import load_plan
from shardrec.trainer.distributed.dist import DistEnv
from shardrec.trainer.inference.eval_request import EvalRequest, check_request, find_checkpoint
from shardrec.trainer.job import data_options
from shardrec.trainer.job.config import JobConfig
from shardrec.trainer.job.sections import OptimConfig
from shardrec.trainer.loop.managed_ids import build_managed_ids
from shardrec.trainer.loop.progress import eval_progress
from shardrec.trainer.loop.steps import evaluate_batches
from shardrec.trainer.loop.train_job import checkpoint_signature
from shardrec.trainer.model import build
from shardrec.trainer.model.objective import TRAIN_EBC_PATH, TRAIN_EC_PATH
from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.checkpoint.manager import CheckpointManager
from shardrec.trainer.rundir.checkpoint.parts import CheckpointParts, ModuleState, TrainProgress
from shardrec.trainer.rundir.id_map_state import IdMapsState

logger = logging.getLogger(__name__)


def eval_loader(config: JobConfig, split: str, env: DistEnv) -> BatchLoader:
    """The loader training evaluated `split` with (trainer.loop.train_job.build_job's eval
    loaders)."""
    return build_loader(
        config.data.path,
        split,
        global_batch_size=config.eval.batch_size or config.train.global_batch_size,
        rank=env.rank,
        world_size=env.world_size,
        shuffle=NO_SHUFFLE,
        tail="pad",
        delivery=data_options.delivery(config.data, env.device.type),
        multihot=data_options.multihot_option(config.data),
    )


def _lookup_optim(config: JobConfig, device_kind: str) -> OptimConfig:
    """The optimizer settings to build the evaluated model with: the run's, unless fbgemm has no
    kernel for its sparse optimizer on this device (Adam, trained on CUDA, evaluated on the CPU):
    evaluation steps no optimizer, and a table's lookup does not depend on it."""
    if device_kind in sparse_optimizer(config.optim.sparse).devices:
        return config.optim
    logger.debug("%s has no %s kernel: tables built with sgd", config.optim.sparse, device_kind)
    return dataclasses.replace(config.optim, sparse="sgd")


def evaluate_checkpoint(request: EvalRequest, env: DistEnv) -> dict[str, Any]:
    """Load the checkpoint's weights (resharded onto this world size) and evaluate the split;
    returns its metrics with the step, split and world sizes (every rank returns the same)."""
    config, raw = check_request(request, env.world_size)
    step, path = find_checkpoint(request.run_dir, request.step)
    manifest = data_options.model_manifest(raw, config.data)
    saved_plan = load_plan(Path(request.run_dir) / names.PLAN)
    # The run's own plan where it fits: the same shards give the same sums, hence the same AUC bits.
    fits = (saved_plan.fingerprint.world_size, saved_plan.fingerprint.device_kind) == (
        env.world_size,
        env.device.type,
    )
    # Elsewhere the planner places the tables freely: the job's constraints were chosen for its own
    # world size (a column split or a rank list may not exist on this one), and any placement
    # holds the same weights.
    sharding = config.sharding if fits else dataclasses.replace(config.sharding, constraints={})
    model, tables, plan = build.build_sharded_model(
        manifest,
        env,
        model_config=config.model,
        # Evaluation runs the dense layers eagerly (DLRM.forward outside training): nothing to
        # compile, and no "compiling the dense layers" line for a run that trained compiled.
        train=dataclasses.replace(config.train, compile="off"),
        optim=_lookup_optim(config, env.device.type),
        sharding=sharding,
        plan=saved_plan if fits else None,
        plan_source=str(Path(request.run_dir) / names.PLAN),
        table_settings=config.tables,
    )
    # Raw ids become rows through the checkpoint's id maps, read only (nothing is admitted).
    managed = build_managed_ids(
        job_tables(manifest, config.tables),
        tables,
        model,
        None,
        ebc_path=TRAIN_EBC_PATH,
        ec_path=TRAIN_EC_PATH,
        seed=config.train.seed,
        stretch_steps=0,
        timeout_s=config.dist.timeout_s,
    )
    # The checkpoint checks the dataset's fingerprint too, unless other data was asked for.
    fingerprint = "" if request.data is not None else dataset_fingerprint(raw)
    older = () if request.data is not None else older_fingerprints(raw)
    parts = CheckpointParts(
        progress=TrainProgress(),
        sharded={"model": ModuleState(model)},
        main={"id_maps": IdMapsState(managed.maps, None, False)} if managed is not None else {},
        signature=checkpoint_signature(config.model, config.optim, tables, fingerprint, older),
        layout=plan.to_json(),
        per_rank={},
    )
    train_world = CheckpointManager(path.parent, env, keep=1, parts=parts).load(path)
    if env.is_main:
        logger.info(
            "evaluating %s (step %d, saved by %d rank%s, now %d) on %s",
            path,
            step,
            train_world,
            "" if train_world == 1 else "s",
            env.world_size,
            request.split,
        )
    start = time.perf_counter()
    model.eval()
    loader, cap = eval_loader(config, request.split, env), config.eval.max_batches
    with eval_progress(min(len(loader), cap) if cap else len(loader), env.is_main) as advance:
        batches = iter(loader) if managed is None else managed.eval_batches(iter(loader))
        metrics = evaluate_batches(model, batches, env.device, cap, on_batch=advance)
    metrics["seconds"] = round(time.perf_counter() - start, 3)
    return {
        "run_dir": str(request.run_dir),
        "step": step,
        "split": request.split,
        "data": config.data.path,
        "world_size": env.world_size,
        "trained_world_size": train_world,
        **metrics,
    }
