"""MLPerf's log of a run: `:::MLLOG {json}` lines in RUN/mllog.jsonl (train.mlperf_log).

The lines are mlcommons/logging's (mllog.py's LOG_TEMPLATE and key order: namespace, time_ms,
event_type, key, value, metadata with the caller's file and line), written here rather than
through the mlperf-logging package, which is not on the package index this project installs
from. The events and keys are the ones its compliance checker reads for dlrm_dcnv2 (ruleset
training_6.0.0) and in the order the reference (torchrec_dlrm/dlrm_main.py) logs them: init
(submission, batch, optimizer settings), run_start, train_samples, epoch_start, per evaluation
eval_start / eval_accuracy / eval_stop (eval_samples once), then run_stop and epoch_stop.

A sequence model (model.arch = "hstu") logs DLRMv4's (ruleset training_6.1.0, closed_dlrmv4.yaml
of mlcommons/logging PR #470; the reference's train/mlperf_logging_utils.py): the init keys of
dense Adam and sparse row-wise Adagrad, the warm-up from 0, max_sequence_length, the evaluation
cadence (eval_every_data_pct) and its skip point (skip_eval_epoch_pct); then train_samples and
eval_samples at run_start, and blocks of training between evaluations (block_start / block_stop)
instead of epochs, every event after run_start carrying samples_count (global samples trained)
and epoch_num. Only rank 0 writes; other ranks hold a logger that writes nothing.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from shardrec.trainer.job.model_section import ModelConfig
from shardrec.trainer.job.sections import EvalConfig, OptimConfig

POINT_IN_TIME, INTERVAL_START, INTERVAL_END = "POINT_IN_TIME", "INTERVAL_START", "INTERVAL_END"
BENCHMARK = "dlrm_dcnv2"
DLRMV4 = "dlrmv4"


def benchmark_of(model: ModelConfig) -> str:
    """The MLPerf benchmark a model's run logs as: DLRMv4 for HSTU, DLRMv2 (dlrm_dcnv2) else."""
    return DLRMV4 if model.arch == "hstu" else BENCHMARK


def progress(samples: int, train_samples: int) -> dict[str, float]:
    """DLRMv4's metadata of an event after run_start: global samples trained, and as epochs."""
    return {"samples_count": samples, "epoch_num": samples / max(train_samples, 1)}


class MlperfLog:
    """MLPerf events (none when not `enabled`): held from the init phase until `open` names the
    file (the run directory is only written once the run is known to go ahead), then appended one
    flushed line each, so that a run killed midway leaves every event logged before it."""

    def __init__(self, enabled: bool, benchmark: str = BENCHMARK) -> None:
        self.enabled = enabled
        self.benchmark = benchmark
        self._held: list[str] | None = [] if enabled else None
        self._file = None
        self.logged_eval_samples = False
        """eval_samples is logged at the first evaluation only (the checker wants exactly one)."""
        self.block_open = False
        """DLRMv4: a block of training is open (block_start logged, its block_stop not yet)."""

    def block(self, start: bool, samples: int, train_samples: int) -> None:
        """DLRMv4: open (or close) a block of training between evaluations, once."""
        if self.benchmark != DLRMV4 or self.block_open == start:
            return
        if start:
            self.start("block_start", metadata=progress(samples, train_samples))
        else:
            self.end("block_stop", metadata=progress(samples, train_samples))
        self.block_open = start

    def open(self, path: Path) -> None:
        """Write the held events to `path`, then stream. An earlier invocation's log there (a
        resumed run's first part) is kept beside it as `mllog.N.jsonl`, N = 1, 2, ... in order:
        each invocation's log is one the compliance checker reads whole."""
        if self._held is None:
            return
        if path.is_file() and path.stat().st_size:
            k = 1
            while path.with_name(f"{path.stem}.{k}{path.suffix}").exists():
                k += 1
            os.replace(path, path.with_name(f"{path.stem}.{k}{path.suffix}"))
        self._file = path.open("w", encoding="utf-8")
        self._file.writelines(self._held)
        self._file.flush()
        self._held = None

    def event(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        self._write(POINT_IN_TIME, key, value, metadata)

    def start(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        self._write(INTERVAL_START, key, value, metadata)

    def end(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        self._write(INTERVAL_END, key, value, metadata)

    def _write(
        self, event_type: str, key: str, value: Any, metadata: dict[str, Any] | None
    ) -> None:
        if not self.enabled:
            return
        caller = sys._getframe(
            2
        )  # the line that logged the event, as mllog's get_caller records it
        where = {"file": Path(caller.f_code.co_filename).name, "lineno": caller.f_lineno}
        record = {
            "namespace": "",
            "time_ms": int(time.time() * 1e3),
            "event_type": event_type,
            "key": key,
            "value": value,
            "metadata": {**where, **(metadata or {})},
        }
        line = f":::MLLOG {json.dumps(record)}\n"
        if self._file is None:
            self._held.append(line)  # type: ignore[union-attr]
            return
        self._file.write(line)
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self.enabled, self._file, self._held = False, None, None


def log_init(
    log: MlperfLog,
    *,
    submission: dict[str, str],
    platform: str,
    global_batch_size: int,
    seed: int,
    optim: OptimConfig,
    model: ModelConfig | None = None,
    evaluation: EvalConfig | None = None,
) -> None:
    """The init phase's events up to the run settings (the caller ends it with init_stop)."""
    log.event("cache_clear", True)
    log.start("init_start")
    log.event("submission_benchmark", log.benchmark)
    log.event("submission_org", submission.get("org", "shardrec"))
    log.event("submission_division", submission.get("division", "closed"))
    log.event("submission_status", submission.get("status", "onprem"))
    log.event("submission_platform", submission.get("platform", platform))
    log.event("global_batch_size", global_batch_size)
    log.event("gradient_accumulation_steps", 1)
    log.event("seed", seed)
    if log.benchmark == DLRMV4:
        _log_dlrmv4_settings(log, optim, model or ModelConfig(), evaluation or EvalConfig())
        return
    both_adagrad = optim.sparse == optim.dense == "adagrad"
    log.event("opt_name", "adagrad" if both_adagrad else f"{optim.sparse}+{optim.dense}")
    # MLPerf has one base rate for the tables and the dense layers; the rule check warns when they
    # differ.
    log.event("opt_base_learning_rate", optim.sparse_lr)
    # torch's and fbgemm's Adagrad as shardrec builds them: no LR decay, weight decay or initial
    # sum.
    log.event("opt_adagrad_learning_rate_decay", 0.0)
    log.event("opt_weight_decay", 0.0)
    log.event("opt_adagrad_initial_accumulator_value", 0.0)
    log.event("opt_adagrad_epsilon", optim.eps)
    log.event("opt_learning_rate_warmup_steps", optim.warmup_steps)
    log.event("opt_learning_rate_decay_start_step", optim.decay_start)
    log.event("opt_learning_rate_decay_steps", optim.decay_steps)


OPTIMIZER_NAMES = {
    "adam": "Adam",
    "adagrad": "Adagrad",
    "sgd": "SGD",
    "rowwise_adagrad": "RowWiseAdagrad",
}
"""shardrec's optimizer names as DLRMv4's log writes them."""


def _log_dlrmv4_settings(
    log: MlperfLog, optim: OptimConfig, model: ModelConfig, evaluation: EvalConfig
) -> None:
    """DLRMv4's settings, in the reference's order (its MLPerfLogger.log_run_start)."""
    log.event("opt_name", OPTIMIZER_NAMES[optim.dense])
    log.event("opt_base_learning_rate", optim.dense_lr)
    log.event("opt_adam_beta_1", optim.adam_beta1)
    log.event("opt_adam_beta_2", optim.adam_beta2)
    log.event("opt_adam_epsilon", optim.eps)
    log.event("opt_weight_decay", 0.0)
    log.event("opt_gradient_clip_norm", optim.clip_grad_norm)
    log.event("opt_learning_rate_warmup_steps", optim.warmup_steps)
    # The rate of the first step: 0 with DLRMv4's warm-up, lr / warmup_steps with DLRMv2's.
    first = 0.0 if optim.warmup_from_zero else optim.dense_lr / max(optim.warmup_steps, 1)
    log.event("opt_learning_rate_warmup_start_lr", first)
    log.event("opt_sparse_name", OPTIMIZER_NAMES[optim.sparse])
    log.event("opt_sparse_base_learning_rate", optim.sparse_lr)
    log.event("max_sequence_length", model.hstu_max_seq_len)
    log.event("eval_every_data_pct", evaluation.every_epoch_fraction)
    log.event("skip_eval_epoch_pct", evaluation.skip_until_fraction)
