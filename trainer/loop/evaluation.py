"""The training loop's evaluations: every evaluation split scored at a boundary (the fused
optimizers' step counters left as they were) and reported, and MLPerf's log of them and of the
run's stop."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from torchrec.datasets.utils import Batch

from shardrec.embeddings import table_batches
from shardrec.trainer.loop.progress import TrainReporter
from shardrec.trainer.loop.steps import evaluate_batches
from shardrec.trainer.loop.target import TargetTracker
from shardrec.trainer.loop.train_job import Job
from shardrec.trainer.rundir.metrics_log import auc_text
from shardrec.trainer.rundir.mllog import DLRMV4, progress


def evaluate_all(
    job: Job,
    step: int,
    reporter: TrainReporter,
    final: bool,
    splits: list[str] | None = None,
    mlperf: str = "",
) -> dict[str, dict[str, Any]]:
    """Evaluate `splits` (default: every evaluation split) and report each; the split `mlperf`
    (MLPerf's scheduled evaluation of it) also goes to the MLPerf log."""
    model = job.runner.eval_mode()
    # Evaluation batches are no optimizer steps: fbgemm's step counters must not count them.
    with table_batches.kept(table_batches.table_batches(job.model.fused_optimizer)):
        return _evaluate_splits(job, model, step, reporter, final, splits, mlperf)


def _evaluate_splits(
    job: Job,
    model: Any,
    step: int,
    reporter: TrainReporter,
    final: bool,
    splits: list[str] | None,
    mlperf: str,
) -> dict[str, dict[str, Any]]:
    results = {}
    epoch_num: dict[str, float] = {"epoch_num": step / len(job.train_loader)}
    v4 = job.mllog.benchmark == DLRMV4
    if v4:  # DLRMv4: samples trained, and epochs of the train windows' anchors
        epoch_num = progress(
            step * job.config.train.global_batch_size, job.train_loader.num_samples
        )
    if mlperf:
        job.mllog.block(False, int(epoch_num.get("samples_count", 0)), job.train_loader.num_samples)
        job.mllog.start("eval_start", metadata=epoch_num)
    for split, loader in job.eval_loaders.items():
        if splits is not None and split not in splits:
            continue
        start = time.perf_counter()
        metrics = evaluate_batches(
            model, eval_stream(job, iter(loader)), job.env.device, job.config.eval.max_batches
        )
        metrics["seconds"] = round(time.perf_counter() - start, 3)
        results[split] = metrics
        reporter.write({"kind": "eval", "split": split, "step": step, "final": final, **metrics})
        reporter.say(
            "step %d %s: auc %s logloss %.4f ne %.4f",
            step,
            split,
            auc_text(metrics),
            metrics["logloss"],
            metrics["ne"],
        )
    if mlperf in results:
        job.mllog.event("eval_accuracy", results[mlperf]["auc"], metadata=epoch_num)
        job.mllog.end("eval_stop", metadata=epoch_num)
        if v4 and not final:
            job.mllog.block(True, int(epoch_num["samples_count"]), job.train_loader.num_samples)
        if not job.mllog.logged_eval_samples and not v4:
            # The reference logs it at the first evaluation only (the checker wants exactly one).
            job.mllog.event(
                "eval_samples", job.eval_loaders[mlperf].num_samples, metadata=epoch_num
            )
            job.mllog.logged_eval_samples = True
    return results


def mlperf_stop(job: Job, tracker: TargetTracker) -> None:
    """run_stop (success at the target's evaluation, else aborted) and epoch_stop, in the
    reference's order."""
    if not job.mllog.enabled:
        return
    if job.mllog.benchmark == DLRMV4:  # blocks, no epochs
        step = tracker.reached["step"] if tracker.reached else job.progress.step
        done = progress(step * job.config.train.global_batch_size, job.train_loader.num_samples)
        job.mllog.block(False, int(done["samples_count"]), job.train_loader.num_samples)
        status = "success" if tracker.reached else "aborted"
        job.mllog.end("run_stop", metadata={"status": status, **done})
        job.mllog.close()
        return
    if tracker.reached:
        epoch_num = tracker.reached["step"] / len(job.train_loader)
        job.mllog.end("run_stop", metadata={"status": "success", "epoch_num": epoch_num})
        job.mllog.end("epoch_stop", metadata={"epoch_num": 0})
    else:
        job.mllog.end("epoch_stop", metadata={"epoch_num": 0})
        job.mllog.end(
            "run_stop",
            metadata={"status": "aborted", "epoch_num": job.progress.step / len(job.train_loader)},
        )
    job.mllog.close()


def eval_stream(job: Job, batches: Iterator[Batch]) -> Iterator[Batch]:
    """Evaluation batches as the model reads them: raw ids remapped by the maps, read only."""
    return job.managed.eval_batches(batches) if job.managed is not None else batches
