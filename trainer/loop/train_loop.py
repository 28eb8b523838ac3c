"""The training loop, whole: a run of epochs, each cut into segments at the evaluation and
checkpoint boundaries, each segment a run of steps (steps.StepRunner).

Training proceeds in segments of whole steps. At a segment's end the pipeline has run every
batch it was given (none is in flight), so the model, the optimizers and the loader's position
all describe the same step: that is where checkpoints are written and evaluation runs, which
is what makes a resumed run bitwise equal to an uninterrupted one.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from torchrec.datasets.utils import Batch

from shardrec.dataloader.files import atomic_write_bytes
from shardrec.trainer.distributed import faults
from shardrec.trainer.distributed.launch import STOP_CHECK_STEPS
from shardrec.trainer.distributed.stop import StopAgreement
from shardrec.trainer.loop.progress import TrainReporter
from shardrec.trainer.loop.steps import LossWindow, StepRunner, StepStats, evaluate_batches
from shardrec.trainer.loop.target import EvalSchedule, TargetTracker
from shardrec.trainer.loop.train_job import Job, write_run_files
from shardrec.trainer.rundir import lifecycle, names
from shardrec.trainer.rundir.metrics_log import MetricsWriter

logger = logging.getLogger(__name__)


def _evaluate_all(job: Job, step: int, reporter: TrainReporter, final: bool) -> dict[str, dict[str, Any]]:
    model = job.runner.eval_mode()
    results = {}
    for split, loader in job.eval_loaders.items():
        start = time.perf_counter()
        metrics = evaluate_batches(model, iter(loader), job.env.device, job.config.eval.max_batches)
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


def train_segment(
    runner: StepRunner,
    batches: Iterator[Batch],
    *,
    num_steps: int,
    first_step: int,
    report_every: int,
    on_step: Callable[[int], None],
    on_report: Callable[[StepStats], None],
    stop: StopAgreement | None = None,
) -> int:
    """Run up to `num_steps` steps from `batches`; returns how many ran (fewer if they ran out,
    or when the ranks agree to `stop`: `batches` must then come from its until_stopped).

    Every `report_every` steps (and STOP_CHECK_STEPS with `stop`) and at the segment's end (before
    any checkpoint), the ranks reduce the loss, a NaN/inf flag and their stop requests together,
    so they report the same global loss, stop together on a bad loss before a bad state can be
    saved, and agree to stop.
    """
    done, window = 0, LossWindow(first_step)

    def report(step: int) -> None:
        stats = window.report(step, stop is not None and stop.request.requested)
        if stop is not None and stats.stop:
            stop.stopped = True
        on_report(stats)

    for loss_sum, samples in runner.run(itertools.islice(batches, num_steps)):
        done += 1
        step = first_step + done
        window.add(loss_sum, samples)
        on_step(step)
        if step % report_every == 0 or (stop is not None and step % STOP_CHECK_STEPS == 0):
            report(step)
    if window.steps:
        report(first_step + done)
    return done


def _train(job: Job, total: int, reporter: TrainReporter, tracker: TargetTracker) -> tuple[float, int]:
    """Run segments up to step `total` (or until `tracker`'s target AUC is reached, or the ranks
    are asked to stop: then after a checkpoint of the step reached), evaluating and checkpointing
    at their boundaries; returns (seconds, samples) spent training."""
    cfg, progress = job.config, job.progress
    steps_per_epoch = len(job.train_loader)
    seconds, samples = 0.0, 0
    schedule = EvalSchedule.of(cfg.eval.interval_steps, cfg.eval.every_epoch_fraction, steps_per_epoch)

    def on_step(step: int) -> None:
        faults.maybe_kill("kill", step, job.env.rank)
        faults.maybe_poison(job.model, step, job.env.rank)
        faults.maybe_slow(step, job.env.rank)

    while progress.step < total:
        job.train_loader.set_epoch(progress.epoch)
        batches = job.stop.until_stopped(iter(job.train_loader))
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
                stop=job.stop,
            )
            seconds += time.perf_counter() - start
            samples += done * cfg.train.global_batch_size
            progress.step += done
            if done < wanted and job.stop.stopped:
                if all(step != progress.step for step, _ in job.checkpoints.complete()):
                    job.checkpoints.save()
                return seconds, samples
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


def _record_stop(job: Job, reporter: TrainReporter) -> dict[str, Any]:
    """A run stopped on request: its checkpoint is written; metrics.jsonl says so (`shardrec runs`
    shows it as stopped) and no summary is written (the run is not complete)."""
    step = job.progress.step
    reason = job.stop.request.signal_name or "another rank's stop request"
    reporter.write({"kind": "stop", "step": step, "reason": reason})
    reporter.say("step %d: stopped (%s); checkpoint written", step, reason)
    return {"steps": step, "stopped": reason}


def run_job(job: Job) -> dict[str, Any]:
    """Train (resuming from the newest checkpoint in the run directory if there is one),
    evaluate, checkpoint; returns the summary (meaningful on rank 0)."""
    cfg = job.config
    total = cfg.train.total_steps(len(job.train_loader))
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
        if job.stop.stopped:
            return _record_stop(job, reporter)
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
        atomic_write_bytes(job.run_dir / names.SUMMARY, (json.dumps(summary, indent=2, default=str) + "\n").encode())
    return summary
