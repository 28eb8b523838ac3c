"""What a run directory holds, read without torch (RunDir: its newest complete checkpoint, its
summary, the target or stop record that ended it), its status as `shardrec runs` lists it
(complete, running, stopped, failed, damaged, misnamed), a stop's record and line, and the runs under a folder.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardrec.dataloader.util import locks
from shardrec.trainer.job.config import JobConfig
from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.checkpoint.readable import unreadable_problem
from shardrec.trainer.rundir.checkpoint.trust import (
    REFUSED,
    checkpoint_problem,
    complete_checkpoints,
)
from shardrec.trainer.rundir.life.stretches import Stretch, read_stretches
from shardrec.trainer.rundir.metrics_log import append_record, current_records, load_metrics

STOPPED_EXIT_CODE = 75
"""`shardrec train`'s exit code after a stop on request with its checkpoint written (EX_TEMPFAIL:
rerun to resume)."""


@dataclass(frozen=True)
class RunDir:
    """What a run directory holds, read without torch."""

    path: Path
    step: int | None
    """Step of the newest complete checkpoint (None: none)."""
    summary: dict[str, Any] | None
    target: dict[str, Any] | None = None
    """The metrics.jsonl record of the train.target_auc stop that ended the run at `step` (None:
    none)."""
    stop: dict[str, Any] | None = None
    """The metrics.jsonl record of a stop on request (SIGTERM / SIGINT) at `step` (None: none)."""
    open_stretch: bool = False
    """The run's last stretch (stretches.json) has not ended; killed or stopped before its first
    checkpoint, it leaves the summary and newest checkpoint of the stretch before."""

    @property
    def complete(self) -> bool:
        """The last invocation finished: its summary is of the newest checkpoint's step, and no
        stretch begun since is open."""
        return (
            self.summary is not None
            and self.step is not None
            and self.summary.get("steps") == self.step
            and not self.open_stretch
        )

    def complete_for(self, config: JobConfig, total: int) -> bool:
        """Whether a job of `config`, which runs to step `total`, has nothing left to do here: the
        run finished at `total`, or it stopped at a target AUC that `config`'s target still
        accepts."""
        if not self.complete:
            return False
        if self.step == total:
            return True
        target = config.train.target_auc
        # A raised or cleared target (--allow-change train.target_auc) continues the run.
        return self.target is not None and bool(target) and self.target["auc"] >= target


def read_run_dir(path: Path) -> RunDir:
    done = complete_checkpoints(Path(path) / names.CHECKPOINTS)
    summary = None
    try:
        summary = json.loads((Path(path) / names.SUMMARY).read_text())
    except (OSError, ValueError):
        pass  # no summary, or a torn one: the run did not finish
    summary = summary if isinstance(summary, dict) else None
    step = done[-1][0] if done else None
    open_stretch = _open_stretch(Path(path))
    finished = summary is not None and summary.get("steps") == step and not open_stretch
    target = (
        _newest_record(Path(path), ("target",), step)
        if finished and summary.get("target_reached")
        else None
    )
    # A stop counts until a later invocation resumes (which may then have failed) or begins a
    # stretch; before the first checkpoint, until a later invocation writes anything.
    stop = None
    if step is not None and not finished:
        stop = _newest_record(Path(path), ("stop", "resume", "stretch"), step)
    elif step is None:
        stop = next(iter(metrics_records(Path(path))[-1:]), None)
    stop = stop if stop and stop.get("kind") == "stop" else None
    return RunDir(Path(path), step, summary, target, stop, open_stretch)


def checkpoint_damage(run: RunDir) -> str:
    """Why `run`'s newest complete checkpoint would be refused ("" when it would not): a file
    missing or added, or one but the `.distcp` shards changed since its save (trust.py's check),
    or one that cannot be read though it matches its digests (saved cut short: readable.py's),
    as `shardrec train` checks it before starting ranks (the ranks hash the shards too). Not in
    read_run_dir: a managed run's train_state.pt, hashed here, may be large."""
    if run.step is None:
        return ""
    checkpoint = run.path / names.CHECKPOINTS / names.checkpoint_name(run.step)
    return checkpoint_problem(checkpoint) or unreadable_problem(checkpoint, REFUSED)


def _open_stretch(run_dir: Path) -> bool:
    """Whether the run's last stretch is unfinished (stretches.json; an unreadable one counts as
    none here: the commands that go on refuse it in their own line)."""
    stretches = _stretches(run_dir)
    return bool(stretches) and stretches[-1].last_step is None


def _current_start(run_dir: Path) -> int:
    """The step the run's current stretch began from (0: it never went on), as _open_stretch reads
    stretches.json."""
    stretches = _stretches(run_dir)
    return stretches[-1].first_step if stretches else 0


def _stretches(run_dir: Path) -> list[Stretch]:
    """stretches.json's stretches; none where it is unreadable (the commands that go on refuse it
    in their own line)."""
    try:
        return read_stretches(run_dir)
    except ValueError:
        return []


def _newest_record(
    run_dir: Path, kinds: tuple[str, ...], step: int | None
) -> dict[str, Any] | None:
    """The newest record of one of `kinds` in RUN/metrics.jsonl, if it is of `step`: a `target`
    record (trainer.loop.target) with its AUC, a `stop` or `resume` record
    (trainer.loop.job_run)."""
    found = None
    for record in metrics_records(run_dir):
        if record.get("kind") in kinds and (
            record["kind"] != "target" or isinstance(record.get("auc"), (int, float))
        ):
            found = record
    return found if found is not None and found.get("step") == step else None


def metrics_records(run_dir: Path) -> list[dict[str, Any]]:
    """RUN/metrics.jsonl's records (none without the file); torn lines skipped."""
    if not (Path(run_dir) / names.METRICS).is_file():
        return []
    return load_metrics(run_dir, torn="any").records


def run_status(
    run: RunDir, active_seconds: float = 120.0, damaged: bool = False, misnamed: bool = False
) -> str:
    """complete, running, stopped, failed, damaged or misnamed. Running: a job holds RUN/.lock
    (trainer.rundir.lock's flock), or, in a run without a lock file, metrics were written in the
    last `active_seconds`. Damaged (`damaged`: checkpoint_damage found a problem): not running,
    and its newest checkpoint would be refused, so a rerun, eval or export of it fails. Misnamed
    (`misnamed`: a checkpoint folder renamed, copied or moved by hand, which train refuses to
    resume beside): not complete, not running. Stopped:
    its last job stopped on request (a rerun resumes from its newest checkpoint, or starts over
    where it had none): after a checkpoint, or at once (record_stop_at_once)."""
    if run.complete and not damaged:
        return "complete"
    lock, metrics = run.path / names.LOCK, run.path / names.METRICS
    if lock.is_file():
        running = locks.holder_of(lock) is not None
    else:
        running = metrics.is_file() and time.time() - metrics.stat().st_mtime < active_seconds
    if running:
        return "running"
    if misnamed:
        return "misnamed"
    if damaged:
        return "damaged"
    return "stopped" if run.stop is not None else "failed"


def record_stop_at_once(run_dir: Path, reason: str) -> None:
    """Record in RUN/metrics.jsonl that the launcher ended the job at once (a second signal, or no
    checkpoint within checkpoint.stop_grace_s): the run was stopped, not failed, and a rerun
    resumes from its newest complete checkpoint (step None: starts over). Nothing is written where
    rank 0 had not started the run (no config.toml): there is no run to list."""
    run_dir = Path(run_dir)
    if not (run_dir / names.CONFIG).is_file():
        return
    done = complete_checkpoints(run_dir / names.CHECKPOINTS)
    step = done[-1][0] if done else None
    append_record(run_dir, {"kind": "stop", "step": step, "reason": reason, "at_once": True})


def stopped_message(step: int) -> str:
    """What a job stopped by SIGTERM / SIGINT says last."""
    return f"stopped at step {step:,}; checkpoint written; rerun the same command to resume"


def find_runs(root: Path) -> list[Path]:
    """Run directories (a config.toml or checkpoints/ inside, or a job holding its lock: a run in
    its first seconds, before its rank 0 writes anything) at or under `root`, sorted."""
    root = Path(root)
    found = {p.parent for p in root.rglob(names.CONFIG)}
    found |= {p.parent for p in root.rglob(names.CHECKPOINTS) if p.is_dir()}
    found |= {p.parent for p in root.rglob(names.LOCK) if locks.holder_of(p) is not None}
    return sorted(p for p in found if names.CHECKPOINTS not in p.relative_to(root).parts)


def best_auc(run_dir: Path, split: str = "val", upto: int | None = None) -> float | None:
    """The best AUC of `split` in RUN/metrics.jsonl (None: no evaluation with one yet); torn lines
    skipped. Only evaluations of the models the run still holds: those past the step a later
    invocation resumed from, and past `upto` (the step a rerun resumes from), are left out. A run
    that went on (--continue-on) evaluated each stretch on its own data's split: only its current
    stretch's count, as an AUC of another day's split is no measure on this one's."""
    since = _current_start(run_dir)
    kept = [
        (record["step"], record["auc"])
        for record in current_records(metrics_records(run_dir))
        if record.get("kind") == "eval"
        and record.get("split") == split
        and isinstance(record.get("auc"), (int, float))
        and record["auc"] == record["auc"]  # NaN: labels of one class, no AUC to rank
        and isinstance(record.get("step"), int)
    ]
    aucs = [auc for s, auc in kept if (upto is None or s <= upto) and (s > since or not since)]
    return max(aucs) if aucs else None
