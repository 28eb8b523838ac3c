"""One training job on one rank: wire the parts built by trainer.model.build and run the loop.

Called by `python -m shardrec.trainer` (the torchrun entry) on every rank.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from shardrec.dataloader.files import atomic_write_bytes
from shardrec.dataloader.format import Manifest
from shardrec.dataloader.loader import NO_SHUFFLE, BatchLoader, Delivery, ShuffleSpec, build_loader
from shardrec.embeddings.init import init_embedding_weights
from shardrec.sharding.plan_io import PlanFile, load_plan, save_plan
from shardrec.trainer.distributed import faults
from shardrec.trainer.distributed.dist import DistEnv
from shardrec.trainer.job import data_options
from shardrec.trainer.job.config import JobConfig, ModelConfig, OptimConfig
from shardrec.trainer.job.preflight import check_against_dataset
from shardrec.trainer.loop.progress import TrainReporter
from shardrec.trainer.loop.steps import StepRunner, evaluate, train_segment
from shardrec.trainer.loop.target import EvalSchedule, TargetTracker
from shardrec.trainer.model import build
from shardrec.trainer.model.objective import TRAIN_EBC_PATH
from shardrec.trainer.rundir import lifecycle
from shardrec.trainer.rundir.checkpoint import CheckpointManager, CheckpointParts, ModuleState, TrainProgress
from shardrec.trainer.rundir.metrics_log import MetricsWriter
from shardrec.trainer.rundir.optim_state import SparseOptimizerState

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
    manifest: Manifest | None = None
    """The dataset's manifest (its fingerprint goes into RUN/dataset.json)."""


# Optimizer settings that decide what state a checkpoint holds: a change would drop or misread it.
OPTIMIZER_KEYS = ("sparse", "dense")


def checkpoint_signature(model: ModelConfig, optim: OptimConfig, plan: PlanFile, dataset: str = "") -> dict[str, Any]:
    """What must match for a checkpoint to load: the model, its tables, the optimizers' kinds and the
    dataset's fingerprint (trainer.rundir.lifecycle; "" skips that check), not the plan."""
    return {
        "model": asdict(model),
        "optim": {k: getattr(optim, k) for k in OPTIMIZER_KEYS},
        "tables": [{"name": t["name"], "rows": t["rows"], "dim": t["dim"]} for t in plan.fingerprint["tables"]],
        "dataset": dataset,
    }


def checkpoint_parts(
    *,
    plan: PlanFile,
    model: torch.nn.Module,
    runner: StepRunner,
    train_loader: BatchLoader,
    progress: TrainProgress,
    signature: dict[str, Any],
) -> CheckpointParts:
    """What a checkpoint of this job holds, under the names train_state.pt and the DCP files use."""
    return CheckpointParts(
        progress=progress,
        sharded={
            "model": ModuleState(model),
            "fused_optim": SparseOptimizerState(model.fused_optimizer, runner.optimizer, plan),
        },
        main={"optimizer": runner.optimizer, "loader": train_loader},
        signature=signature,
        layout=plan.to_json(),
    )


def build_job(config: JobConfig, env: DistEnv, run_dir: Path, plan_path: str | None) -> Job:
    """Model, plan, sharding, optimizers, loaders and checkpoints for this rank."""
    data_dir = Path(config.data.path)
    manifest = Manifest.load(data_dir)
    # With on-the-fly multi-hot ids the tables have the index tables' rows (data_options).
    seen, multihot = data_options.model_manifest(manifest, config.data), data_options.multihot_option(config.data)
    t, o = config.train, config.optim
    model, tables, plan = build.build_sharded_model(
        seen,
        env,
        model_config=config.model,
        train=t,
        optim=o,
        sharding=config.sharding,
        plan=load_plan(plan_path) if plan_path else None,
    )
    init_embedding_weights(model, tables, t.seed, ebc_path=TRAIN_EBC_PATH)
    optimizer = build.build_optimizer(model, tables, o)
    train_loader = build_loader(
        data_dir,
        config.data.train_split,
        global_batch_size=t.global_batch_size,
        rank=env.rank,
        world_size=env.world_size,
        shuffle=ShuffleSpec(enabled=config.data.shuffle, seed=t.seed),
        tail=config.data.tail,
        delivery=Delivery(num_workers=config.data.num_workers),
        multihot=multihot,
    )
    eval_batch = config.eval.batch_size or t.global_batch_size
    check_against_dataset(config, seen, env.world_size)
    eval_loaders = {
        split: build_loader(
            data_dir,
            split,
            global_batch_size=eval_batch,
            rank=env.rank,
            world_size=env.world_size,
            shuffle=NO_SHUFFLE,
            tail="pad",
            delivery=Delivery(num_workers=config.data.num_workers),
            multihot=multihot,
        )
        for split in config.data.eval_splits
        if split in manifest.splits and manifest.splits[split].rows > 0
    }
    runner = StepRunner(model, optimizer, env.device, t.pipeline)
    progress = TrainProgress()
    parts = checkpoint_parts(
        plan=plan,
        model=model,
        runner=runner,
        train_loader=train_loader,
        progress=progress,
        signature=checkpoint_signature(config.model, config.optim, plan, lifecycle.dataset_fingerprint(manifest)),
    )
    checkpoints = CheckpointManager(
        run_dir / "checkpoints", env, keep=config.checkpoint.keep, parts=parts, timeout_s=config.checkpoint.timeout_s
    )
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
        manifest=manifest,
    )


def write_run_files(job: Job) -> None:
    """The run directory keeps the resolved config and the plan it ran with (rank 0)."""
    if not job.env.is_main:
        return
    job.run_dir.mkdir(parents=True, exist_ok=True)
    # data.path as an absolute path, so that eval and export find the data from any directory;
    # dataset.json keeps the path as given too.
    saved = lifecycle.with_absolute_data_path(job.config)
    atomic_write_bytes(job.run_dir / "config.toml", saved.to_toml().encode())
    if job.manifest is not None:
        record = lifecycle.dataset_record(saved.data.path, job.manifest, given=job.config.data.path)
        atomic_write_bytes(job.run_dir / lifecycle.DATASET_RECORD, record)
    save_plan(job.plan, job.run_dir / "plan.json")


def _evaluate_all(job: Job, step: int, reporter: TrainReporter, final: bool) -> dict[str, dict[str, Any]]:
    model = job.runner.eval_mode()
    results = {}
    for split, loader in job.eval_loaders.items():
        start = time.perf_counter()
        metrics = evaluate(model, iter(loader), job.env.device, job.config.eval.max_batches)
        metrics["seconds"] = round(time.perf_counter() - start, 3)
        results[split] = metrics
        reporter.write({"kind": "eval", "split": split, "step": step, "final": final, **metrics})
        reporter.say(
            "step %d %s: auc %.4f logloss %.4f ne %.4f", step, split, metrics["auc"], metrics["logloss"], metrics["ne"]
        )
    return results


def _next_boundary(step: int, end: int, *intervals: int) -> int:
    candidates = [end] + [(step // k + 1) * k for k in intervals if k > 0]
    return min(c for c in candidates if c > step)


def _train(job: Job, total: int, reporter: TrainReporter, tracker: TargetTracker) -> tuple[float, int]:
    """Run segments up to step `total` (or until `tracker`'s target AUC is reached), evaluating
    and checkpointing at their boundaries; returns (seconds, samples) spent training."""
    cfg, progress = job.config, job.progress
    steps_per_epoch = len(job.train_loader)
    seconds, samples = 0.0, 0
    schedule = EvalSchedule.of(cfg.eval.interval_steps, cfg.eval.every_epoch_fraction, steps_per_epoch)

    def on_step(step: int) -> None:
        faults.maybe_kill("kill", step, job.env.rank)
        faults.maybe_poison(job.model, step, job.env.rank)

    while progress.step < total:
        job.train_loader.set_epoch(progress.epoch)
        batches = iter(job.train_loader)
        epoch_start, epoch_end = progress.epoch * steps_per_epoch, min(total, (progress.epoch + 1) * steps_per_epoch)
        while progress.step < epoch_end:
            boundary = _next_boundary(progress.step, epoch_end, cfg.checkpoint.interval_steps)
            boundary = min(boundary, schedule.next_after(progress.step, epoch_start) or boundary)
            wanted, start = boundary - progress.step, time.perf_counter()
            reporter.start_segment()
            done = train_segment(
                job.runner,
                batches,
                num_steps=wanted,
                first_step=progress.step,
                report_every=cfg.train.log_interval,
                on_step=on_step,
                on_report=lambda stats: reporter.on_report(stats, progress.epoch),
            )
            seconds += time.perf_counter() - start
            samples += done * cfg.train.global_batch_size
            progress.step += done
            if done < wanted:
                raise RuntimeError(
                    f"step {progress.step}: the train loader ended before the epoch's {steps_per_epoch} steps"
                )
            if progress.step == steps_per_epoch * (progress.epoch + 1):
                progress.epoch += 1
            reached = None
            if schedule.due(progress.step, epoch_start) and progress.step < total:
                reached = tracker.check(
                    progress.step, _evaluate_all(job, progress.step, reporter, final=False), seconds
                )
            if (
                progress.step == total
                or reached
                or (cfg.checkpoint.interval_steps and progress.step % cfg.checkpoint.interval_steps == 0)
            ):
                job.checkpoints.save()
            if reached:
                _report_target(reporter, reached)
                return seconds, samples
    return seconds, samples


def _report_target(reporter: TrainReporter, reached: dict[str, Any]) -> None:
    reporter.write(reached)
    reporter.say(
        "step %d: %s auc %.5f reached the target %.5f after %.1f s and %d samples",
        reached["step"],
        reached["split"],
        reached["auc"],
        reached["target_auc"],
        reached["time_to_target_s"],
        reached["samples_to_target"],
    )


def _final_evaluation(
    job: Job, reporter: TrainReporter, tracker: TargetTracker, seconds: float
) -> dict[str, dict[str, Any]]:
    """The final evaluation; where the run just evaluated this step (a target stop), its results
    are recorded as final instead of evaluating the same weights twice."""
    step = job.progress.step
    if tracker.last is not None and tracker.last[0] == step:
        for split, metrics in tracker.last[1].items():
            reporter.write({"kind": "eval", "split": split, "step": step, "final": True, **metrics})
        return tracker.last[1]
    final = _evaluate_all(job, step, reporter, final=True)
    reached = tracker.check(step, final, seconds)
    if reached:
        _report_target(reporter, reached)
    return final


def run_job(job: Job) -> dict[str, Any]:
    """Train (resuming from the newest checkpoint in the run directory if there is one),
    evaluate, checkpoint; returns the summary (meaningful on rank 0)."""
    cfg = job.config
    total = cfg.train.epochs * len(job.train_loader)
    if cfg.train.steps:
        total = min(total, cfg.train.steps)
    resumed = job.checkpoints.load_latest()
    finished = lifecycle.read_run_dir(job.run_dir)
    if resumed is not None and finished.step == resumed and finished.complete_for(cfg, total):
        # A rerun of a finished run (or of one stopped at its target AUC): its record stays as it was.
        if job.env.is_main:
            logger.info("%s", lifecycle.complete_message(job.run_dir, cfg, finished))
        return dict(finished.summary or {})
    # Only now: a refused resume must leave the run directory describing its checkpoints.
    write_run_files(job)
    writer = MetricsWriter(job.run_dir) if job.env.is_main else None
    reporter = TrainReporter(
        writer,
        total_steps=total,
        first_step=job.progress.step,
        log_interval=cfg.train.log_interval,
        lr=lambda: job.runner.optimizer.param_groups[0]["lr"],
    )
    if resumed is not None:
        reporter.write({"kind": "resume", "step": job.progress.step, "epoch": job.progress.epoch})
    try:
        tracker = TargetTracker.for_splits(cfg.train.target_auc, list(job.eval_loaders), cfg.train.global_batch_size)
        if cfg.train.target_auc and tracker.split is None:
            raise ValueError(
                f"train.target_auc = {cfg.train.target_auc} needs a split to evaluate: "
                "data.eval_splits has none with rows"
            )
        seconds, samples = _train(job, total, reporter, tracker)
        final = _final_evaluation(job, reporter, tracker, seconds)
        summary = {
            "steps": job.progress.step,
            "epochs": job.progress.epoch,
            "world_size": job.env.world_size,
            "global_batch_size": cfg.train.global_batch_size,
            "train_samples_per_s": samples / seconds if seconds else None,
            "train_seconds": round(seconds, 3),
            "resumed_from_step": resumed,
            **tracker.summary(),
        }
        reporter.write({"kind": "summary", "step": job.progress.step, **summary})
    finally:
        reporter.close()
    summary["eval"] = final
    if job.env.is_main:
        atomic_write_bytes(job.run_dir / "summary.json", (json.dumps(summary, indent=2, default=str) + "\n").encode())
    return summary
