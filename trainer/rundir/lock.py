"""One job at a time on a run directory: an flock on RUN/.lock, which names its holder.

Two jobs on one run directory would interleave their checkpoints and metrics. `shardrec train`
takes the lock before it starts any rank and holds it while they run; rank 0 takes it too, so
a job started by torchrun directly is covered, and accepts the lock its own launcher holds
(the lock file names the job id the launcher passed down: trainer.distributed.launch). The
kernel drops an flock when its holder dies, however it dies, so no stale lock outlives a killed
job; the file itself stays (removing it would let two jobs lock two different files).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardrec.dataloader.util import locks
from shardrec.trainer.rundir import names


class RunDirInUse(ValueError):
    """Another job holds the run directory's lock."""


@dataclass
class RunLock:
    """A held lock; `release()` (or the holder's death) frees it."""

    path: Path
    fd: int | None
    holder: dict[str, Any]

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None


def describe_holder(holder: dict[str, Any]) -> str:
    if not holder:
        return "another job (it has not written its host and pid yet)"
    return f"job {holder.get('job', '?')} on host {holder.get('host', '?')}, pid {holder.get('pid', '?')}"


def acquire_run_lock(run_dir: Path, job_id: str | None = None) -> RunLock:
    """Lock `run_dir` for this process (creating the directory), writing host, pid and job id.

    Raises RunDirInUse naming the holder when another job holds it, unless that holder is the
    job `job_id` (the launcher of this very rank); then the returned lock holds nothing itself.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / names.LOCK
    holder = locks.me(job=job_id or "")
    try:
        return RunLock(path, locks.hold(path, holder), holder)
    except locks.Locked as e:
        if job_id and e.holder.get("job") == job_id:
            return RunLock(path, None, e.holder)
        raise RunDirInUse(
            f"{run_dir} is in use by {describe_holder(e.holder)} (lock file {path}); "
            f"wait for that job to end or choose another --out-dir"
        ) from None
