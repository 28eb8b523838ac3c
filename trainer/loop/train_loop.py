"""The training loop, whole: a run of epochs, each cut into segments at the evaluation and
checkpoint boundaries, each segment a run of steps (steps.StepRunner).

Training proceeds in segments of whole steps. At a segment's end the pipeline has run every
batch it was given (none is in flight), so the model, the optimizers and the loader's position
all describe the same step: that is where checkpoints are written and evaluation runs, which
is what makes a resumed run bitwise equal to an uninterrupted one.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from torchrec.datasets.utils import Batch

from shardrec.trainer.distributed import faults
from shardrec.trainer.distributed.launch import STOP_CHECK_STEPS
from shardrec.trainer.distributed.stop import StopAgreement
from shardrec.trainer.loop.evaluation import evaluate_all, mlperf_stop
from shardrec.trainer.loop.progress import TrainReporter
from shardrec.trainer.loop.steps import LossWindow, StepRunner, StepStats
from shardrec.trainer.loop.target import EvalSchedule, TargetTracker, fraction_below_a_step
from shardrec.trainer.loop.train_job import Job

logger = logging.getLogger(__name__)


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
    before_step: Callable[[int], None] | None = None,
) -> int:
    """Run up to `num_steps` steps from `batches`; returns how many ran (fewer if they ran out,
    or when the ranks agree to `stop`: `batches` must then come from its until_stopped).

    Every `report_every` steps (and STOP_CHECK_STEPS with `stop`) and at the segment's end (before
    any checkpoint), the ranks reduce the loss, a NaN/inf flag and their stop requests together,
    so they report the same global loss, stop together on a bad loss before a bad state can be
    saved, and agree to stop.
    """
    done, window = 0, LossWindow(first_step, runner.stages)

    def report(step: int) -> None:
        stats = window.report(step, stop is not None and stop.request.requested)
        if stop is not None and stats.stop:
            stop.stopped = True
        on_report(stats)

    hook = (lambda i: before_step(first_step + i)) if before_step is not None else None
    for loss_sum, samples, finite in runner.run(itertools.islice(batches, num_steps), hook):
        done += 1
        step = first_step + done
        window.add(loss_sum, samples, finite)
        on_step(step)
        if step % report_every == 0 or (stop is not None and step % STOP_CHECK_STEPS == 0):
            report(step)
    if window.steps:
        report(first_step + done)
    return done


def eval_schedule(job: Job) -> EvalSchedule:
    e = job.config.eval
    rows, batch = job.train_loader.num_samples, job.config.train.global_batch_size
    return EvalSchedule.of(
        e.interval_steps,
        e.every_epoch_fraction,
        rows,
        batch,
        rounding=e.fraction_rounding,
        skip_until_fraction=e.skip_until_fraction,
    )


def train_epochs(
    job: Job, total: int, reporter: TrainReporter, tracker: TargetTracker
) -> tuple[float, int]:
    """Run segments up to step `total` (or until `tracker`'s target AUC is reached, or the ranks
    are asked to stop: then after a checkpoint of the step reached), evaluating and checkpointing
    at their boundaries; returns (seconds, samples) spent training."""
    cfg, progress = job.config, job.progress
    steps_per_epoch = len(job.train_loader)
    seconds, samples = 0.0, 0
    schedule = eval_schedule(job)
    e = cfg.eval
    below = fraction_below_a_step(
        e.every_epoch_fraction,
        job.train_loader.num_samples,
        cfg.train.global_batch_size,
        e.fraction_rounding,
    )
    if below and job.env.is_main:
        logger.warning("%s", below)
    during = cfg.eval.during_training or None

    def on_report(stats: StepStats) -> None:
        # The samples the ranks trained on, as they count them: a padded batch's rows are none.
        nonlocal samples
        samples += stats.samples
        reporter.on_report(stats, progress.epoch)

    def on_step(step: int) -> None:
        faults.maybe_kill("kill", step, job.env.rank)
        faults.maybe_poison(job.model, step, job.env.rank)
        faults.maybe_slow(step, job.env.rank)

    # A run that goes on counts the epochs of its current stretch's data from the stretch's start.
    base = progress.stretch_start
    while progress.step < total:
        job.train_loader.set_epoch(progress.epoch)
        batches = job.stop.until_stopped(iter(job.train_loader))
        if job.managed is not None:
            batches = job.managed.train_batches(batches, progress.step)
        epoch_start, epoch_end = (
            base + progress.epoch * steps_per_epoch,
            min(total, base + (progress.epoch + 1) * steps_per_epoch),
        )
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
                on_report=on_report,
                stop=job.stop,
                before_step=job.managed.before_step if job.managed is not None else None,
            )
            seconds += time.perf_counter() - start
            progress.step += done
            if done < wanted and job.stop.stopped:
                if all(step != progress.step for step, _ in job.checkpoints.complete()):
                    job.checkpoints.save()
                return seconds, samples
            if done < wanted:
                raise RuntimeError(
                    f"step {progress.step}: the train loader ended before the epoch's {steps_per_epoch} steps"
                )
            if progress.step == base + steps_per_epoch * (progress.epoch + 1):
                progress.epoch += 1
            reached = None
            if schedule.due(progress.step, epoch_start) and progress.step < total:
                results = evaluate_all(
                    job, progress.step, reporter, False, during, mlperf=tracker.split or ""
                )
                reached = tracker.check(progress.step, results, seconds)
                if reached:
                    mlperf_stop(job, tracker)  # MLPerf's clock stops here, before the checkpoint
            if (
                progress.step == total
                or reached
                or (
                    cfg.checkpoint.interval_steps
                    and progress.step % cfg.checkpoint.interval_steps == 0
                )
            ):
                job.checkpoints.save()
            if reached:
                report_target(reporter, reached)
                return seconds, samples
    return seconds, samples


def report_target(reporter: TrainReporter, reached: dict[str, Any]) -> None:
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
