"""MLPerf's log of a run: `:::MLLOG {json}` lines in RUN/mllog.jsonl (train.mlperf_log).

The lines are mlcommons/logging's (mllog.py's LOG_TEMPLATE and key order: namespace, time_ms,
event_type, key, value, metadata with the caller's file and line), written here rather than
through the mlperf-logging package, which is not on the package index this project installs
from. The events and keys are the ones its compliance checker reads for dlrm_dcnv2 (ruleset
training_6.0.0) and in the order the reference (torchrec_dlrm/dlrm_main.py) logs them: init
(submission, batch, optimizer settings), run_start, train_samples, epoch_start, per evaluation
eval_start / eval_accuracy / eval_stop (eval_samples once), then run_stop and epoch_stop.
Only rank 0 writes; other ranks hold a logger that writes nothing.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from shardrec.trainer.job.config import OptimConfig

POINT_IN_TIME, INTERVAL_START, INTERVAL_END = "POINT_IN_TIME", "INTERVAL_START", "INTERVAL_END"
BENCHMARK = "dlrm_dcnv2"


class MlperfLog:
    """MLPerf events (none when not `enabled`): held from the init phase until `open` names the
    file (the run directory is only written once the run is known to go ahead), then appended one
    flushed line each, so that a run killed midway leaves every event logged before it."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._held: list[str] | None = [] if enabled else None
        self._file = None
        self.logged_eval_samples = False
        """eval_samples is logged at the first evaluation only (the checker wants exactly one)."""

    def open(self, path: Path) -> None:
        """Write the held events to `path` (replacing an earlier invocation's), then stream."""
        if self._held is None:
            return
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
) -> None:
    """The init phase's events up to the run settings (the caller ends it with init_stop)."""
    log.event("cache_clear", True)
    log.start("init_start")
    log.event("submission_benchmark", BENCHMARK)
    log.event("submission_org", submission.get("org", "shardrec"))
    log.event("submission_division", submission.get("division", "closed"))
    log.event("submission_status", submission.get("status", "onprem"))
    log.event("submission_platform", submission.get("platform", platform))
    log.event("global_batch_size", global_batch_size)
    log.event("gradient_accumulation_steps", 1)
    log.event("seed", seed)
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
