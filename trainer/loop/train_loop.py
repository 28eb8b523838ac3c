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

from shardrec.dataloader.util.files import atomic_write_bytes
from shardrec.trainer.distributed import faults
from shardrec.trainer.distributed.launch import STOP_CHECK_STEPS
from shardrec.trainer.distributed.stop import StopAgreement
from shardrec.trainer.loop.evaluation import evaluate_all, mlperf_stop
from shardrec.trainer.loop.progress import TrainReporter
from shardrec.trainer.loop.steps import LossWindow, StepRunner, StepStats
from shardrec.trainer.loop.stretch_run import (
    begin_stretch,
    end_stretch_records,
    start_stretch_records,
)
from shardrec.trainer.loop.target import EvalSchedule, TargetTracker, fraction_below_a_step
from shardrec.trainer.loop.train_job import Job, write_run_files
from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.life import (
    continuation,
    lifecycle,
    resume_settings,
    run_state,
    trained_data,
)
from shardrec.trainer.rundir.metrics_log import MetricsWriter
from shardrec.trainer.rundir.mllog import DLRMV4

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


def _eval_schedule(job: Job) -> EvalSchedule:
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


def _train(
    job: Job, total: int, reporter: TrainReporter, tracker: TargetTracker
) -> tuple[float, int]:
    """Run segments up to step `total` (or until `tracker`'s target AUC is reached, or the ranks
    are asked to stop: then after a checkpoint of the step reached), evaluating and checkpointing
    at their boundaries; returns (seconds, samples) spent training."""
    cfg, progress = job.config, job.progress
    steps_per_epoch = len(job.train_loader)
    seconds, samples = 0.0, 0
    schedule = _eval_schedule(job)
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
    job: Job, reporter: TrainReporter, tracker: TargetTracker, seconds: float, scheduled: bool
) -> dict[str, dict[str, Any]]:
    """The final evaluation of every split; where the run just evaluated this step (a target stop),
    those results are recorded as final instead of evaluating the same weights twice, and only the
    splits not evaluated during training (eval.during_training) run now. Only a `scheduled`
    evaluation (this step is one of the schedule's) goes to the MLPerf log, as the reference
    evaluates no more."""
    step = job.progress.step
    if tracker.last is not None and tracker.last[0] == step:
        done = tracker.last[1]
        for split, metrics in done.items():
            reporter.write({"kind": "eval", "split": split, "step": step, "final": True, **metrics})
        rest = [split for split in job.eval_loaders if split not in done]
        return {
            **done,
            **(evaluate_all(job, step, reporter, final=True, splits=rest) if rest else {}),
        }
    final = evaluate_all(
        job, step, reporter, True, mlperf=(tracker.split or "") if scheduled else ""
    )
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


def _resume(job: Job) -> int | None:
    """Load the newest checkpoint, if any; returns its step. A resume (or a new stretch) whose
    settings differ from the run's says so once the checkpoint loaded (rank 0): no launcher nor
    rank reads its shards before, and a refused checkpoint is then the one line, not a resume
    announced first."""
    # Before write_run_files rewrites config.toml with this job's settings.
    notice = continuation.stretch_notice if job.continuing else lifecycle.resume_notice
    changed = notice(job.run_dir, job.config) if job.env.is_main else None
    # A new stretch takes the run's state but the loader's: its data starts afresh.
    resumed = job.checkpoints.load_latest(skip=("loader",) if job.continuing else ())
    if changed:
        logger.info("%s", changed)
    if resumed is not None and job.managed is not None and not job.continuing and job.env.is_main:
        kept = job.managed.maps.kept_cadence(job.config.train.total_steps(len(job.train_loader)))
        if kept:
            logger.info("%s: %s", job.run_dir, kept)
    return resumed


def _metrics_writer(job: Job, resumed_at: int | None) -> MetricsWriter:
    """Rank 0's writer of the run's records, its TensorBoard events in the current stretch's own
    run folder (metrics_log.tensorboard_dir)."""
    p = job.progress
    return MetricsWriter(
        job.run_dir, resumed_at=resumed_at, stretch=p.stretch, data=str(job.config.data.path)
    )


def run_job(job: Job) -> dict[str, Any]:
    """Train (resuming from the newest checkpoint in the run directory if there is one),
    evaluate, checkpoint; returns the summary (meaningful on rank 0)."""
    cfg = job.config
    previous = trained_data.read_dataset_record(job.run_dir)
    resumed = _resume(job)
    if job.continuing:
        begin_stretch(job)
    total = job.progress.stretch_start + cfg.train.total_steps(len(job.train_loader))
    finished = run_state.read_run_dir(job.run_dir)
    if (
        not job.continuing
        and resumed is not None
        and finished.step == resumed
        and finished.complete_for(cfg, total)
    ):
        # A rerun of a finished run (or of one stopped at its target AUC): its record stays as it
        # was.
        if job.env.is_main:
            logger.info("%s", lifecycle.complete_message(job.run_dir, cfg, finished))
        return dict(finished.summary or {})
    if not job.continuing:
        # Only now: a refused resume must leave the run directory describing its checkpoints.
        write_run_files(job, drew=resumed is None)
    # A resumed run (or stretch) writes again the steps after its checkpoint that a killed run
    # had written: TensorBoard is told to drop those.
    resumed_at = job.progress.step if resumed is not None or job.continuing else None
    writer = _metrics_writer(job, resumed_at) if job.env.is_main else None
    reporter = TrainReporter(
        writer,
        total_steps=total,
        first_step=job.progress.step,
        log_interval=cfg.train.log_interval,
        lr=lambda: job.runner.optimizer.stepped_lr,
        unlogged=job.progress,
    )
    if job.continuing:
        start_stretch_records(job, reporter, previous)
        # The run directory names the new data once stretches.json lists its stretch: a stop
        # before then leaves the run as the previous stretch left it, after it the stretch is
        # begun again until its first checkpoint (stretches.unsaved_stretch).
        write_run_files(job)
    elif resumed is not None:
        reporter.write({"kind": "resume", "step": job.progress.step, "epoch": job.progress.epoch})
    if job.managed is not None or job.continuing:
        job.checkpoints.kept_steps.add(total)  # the stretch's last checkpoint stays
    if job.continuing:
        # So does the previous stretch's, which this one begins from: a run of static tables
        # lists its first stretch in stretches.json only now, after build_job read that file.
        job.checkpoints.kept_steps.add(job.progress.stretch_start)
    if job.env.is_main:
        job.mllog.open(job.run_dir / names.MLLOG)
    if job.mllog.benchmark == DLRMV4:  # the train windows' anchors and the held-out ones
        job.mllog.event("train_samples", job.train_loader.num_samples)
        held_out = job.eval_loaders.get("val") or next(iter(job.eval_loaders.values()), None)
        job.mllog.event("eval_samples", held_out.num_samples if held_out is not None else 0)
        start = job.progress.step * cfg.train.global_batch_size
        job.mllog.block(True, start, job.train_loader.num_samples)
    else:
        job.mllog.event("train_samples", len(job.train_loader) * cfg.train.global_batch_size)
        job.mllog.start("epoch_start", metadata={"epoch_num": 0})
    try:
        during = [
            s
            for s in job.eval_loaders
            if not cfg.eval.during_training or s in cfg.eval.during_training
        ]
        tracker = TargetTracker.for_splits(
            cfg.train.target_auc, during, cfg.train.global_batch_size
        )
        if cfg.train.target_auc and tracker.split is None:
            raise ValueError(
                f"train.target_auc = {cfg.train.target_auc} needs a split to evaluate: "
                "data.eval_splits has none with rows"
            )
        seconds, samples = _train(job, total, reporter, tracker)
        if job.stop.stopped:
            return _record_stop(job, reporter)
        step, steps_per_epoch = job.progress.step, len(job.train_loader)
        base = job.progress.stretch_start
        scheduled = step > base and _eval_schedule(job).due(
            step, base + (step - base - 1) // steps_per_epoch * steps_per_epoch
        )
        final = _final_evaluation(job, reporter, tracker, seconds, scheduled)
        summary = {
            "steps": job.progress.step,
            "epochs": job.progress.epoch,
            "world_size": job.env.world_size,
            "global_batch_size": cfg.train.global_batch_size,
            "train_samples_per_s": samples / seconds if seconds else None,
            "train_seconds": round(seconds, 3),
            "resumed_from_step": resumed,
            # A new stretch (--continue-on): the data it went on with from resumed_from_step,
            # absolute as stretches.json and config.toml keep it (typed, it is the launch
            # directory's: another directory's reader would look for other data).
            "continued_on": (
                str(resume_settings.with_absolute_paths(cfg).data.path) if job.continuing else None
            ),
            # What took this invocation's steps: torchrec's pipeline class, or "plain".
            "pipeline": dict(job.runner.steps_by),
            **tracker.summary(),
        }
        if job.managed is not None:
            summary["id_maps"] = job.managed.stretch_figures()
            reporter.write({"kind": "id_maps", "step": job.progress.step, **summary["id_maps"]})
        reporter.write({"kind": "summary", "step": job.progress.step, **summary})
        end_stretch_records(job, summary.get("id_maps", {}))
        if job.mllog.enabled:  # not stopped at the target during training
            mlperf_stop(job, tracker)
    finally:
        reporter.close()
        job.mllog.close()
    summary["eval"] = final
    if job.env.is_main:
        atomic_write_bytes(
            job.run_dir / names.SUMMARY,
            (json.dumps(summary, indent=2, default=str) + "\n").encode(),
        )
    return summary
