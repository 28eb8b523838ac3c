"""A training job's run, whole: resume from the newest checkpoint (or begin a new stretch),
the run's records (metrics.jsonl, TensorBoard, MLPerf's log), the epochs of training
(train_loop.train_epochs), the final evaluation and the summary.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from shardrec.dataloader.util.files import atomic_write_bytes
from shardrec.trainer.loop.evaluation import evaluate_all, mlperf_stop
from shardrec.trainer.loop.progress import TrainReporter
from shardrec.trainer.loop.stretch_run import (
    begin_stretch,
    end_stretch_records,
    start_stretch_records,
)
from shardrec.trainer.loop.target import TargetTracker
from shardrec.trainer.loop.train_job import Job, write_run_files
from shardrec.trainer.loop.train_loop import eval_schedule, report_target, train_epochs
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
        report_target(reporter, reached)
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


def _is_rerun_of_finished(job: Job, resumed: int | None, total: int) -> dict[str, Any] | None:
    """The summary of a finished run (or of one stopped at its target AUC) that this job reruns
    unchanged, else None; its record stays as it was."""
    finished = run_state.read_run_dir(job.run_dir)
    if (
        not job.continuing
        and resumed is not None
        and finished.step == resumed
        and finished.complete_for(job.config, total)
    ):
        if job.env.is_main:
            logger.info("%s", lifecycle.complete_message(job.run_dir, job.config, finished))
        return dict(finished.summary or {})
    return None


def _open_reporter(job: Job, resumed: int | None, total: int, previous: Any) -> TrainReporter:
    """Rank 0's reporter of the run's records, with the records a resume or a new stretch
    begins with; the checkpoints a run must keep are named here too."""
    cfg = job.config
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
    return reporter


def _open_mllog(job: Job) -> None:
    """Open MLPerf's log (rank 0) and write its run-start records."""
    cfg = job.config
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


def _target_tracker(job: Job) -> TargetTracker:
    """The tracker of train.target_auc over the splits evaluated during training."""
    cfg = job.config
    during = [
        s for s in job.eval_loaders if not cfg.eval.during_training or s in cfg.eval.during_training
    ]
    tracker = TargetTracker.for_splits(cfg.train.target_auc, during, cfg.train.global_batch_size)
    if cfg.train.target_auc and tracker.split is None:
        raise ValueError(
            f"train.target_auc = {cfg.train.target_auc} needs a split to evaluate: "
            "data.eval_splits has none with rows"
        )
    return tracker


def _final_is_scheduled(job: Job) -> bool:
    """Whether the step training ended at is one of the evaluation schedule's."""
    step, steps_per_epoch = job.progress.step, len(job.train_loader)
    base = job.progress.stretch_start
    return step > base and eval_schedule(job).due(
        step, base + (step - base - 1) // steps_per_epoch * steps_per_epoch
    )


def _summary(
    job: Job, resumed: int | None, seconds: float, samples: int, tracker: TargetTracker
) -> dict[str, Any]:
    """The run's summary, less its final evaluation."""
    cfg = job.config
    return {
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


def run_job(job: Job) -> dict[str, Any]:
    """Train (resuming from the newest checkpoint in the run directory if there is one),
    evaluate, checkpoint; returns the summary (meaningful on rank 0)."""
    cfg = job.config
    previous = trained_data.read_dataset_record(job.run_dir)
    resumed = _resume(job)
    if job.continuing:
        begin_stretch(job)
    total = job.progress.stretch_start + cfg.train.total_steps(len(job.train_loader))
    rerun = _is_rerun_of_finished(job, resumed, total)
    if rerun is not None:
        return rerun
    if not job.continuing:
        # Only now: a refused resume must leave the run directory describing its checkpoints.
        write_run_files(job, drew=resumed is None)
    reporter = _open_reporter(job, resumed, total, previous)
    _open_mllog(job)
    try:
        tracker = _target_tracker(job)
        seconds, samples = train_epochs(job, total, reporter, tracker)
        if job.stop.stopped:
            return _record_stop(job, reporter)
        final = _final_evaluation(job, reporter, tracker, seconds, _final_is_scheduled(job))
        summary = _summary(job, resumed, seconds, samples, tracker)
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
