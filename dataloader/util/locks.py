"""One writer at a time: an flock on a lock file that names its holder (host, pid, what it runs).

The kernel drops an flock when its holder dies, however it dies, so no stale lock outlives a
killed writer; the file itself stays (removing it would let two writers lock two different
files). Used for a dataset being written (`shardrec preprocess`, `dataset_lock`) and a run
directory (trainer.rundir.lock). POSIX only, as the trainer is.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

WORK_DIR = ".work"
"""Where preprocessing keeps its progress inside a dataset (tools/preprocess/tasks/ writes it)."""
DATASET_LOCK = "lock"
"""The lock file of a dataset being written, in its WORK_DIR (`lock-part-K` for `--part K/N`)."""


class Locked(Exception):
    """Another process holds the lock; `holder` is what it wrote in the file ({} before it
    wrote)."""

    def __init__(self, path: Path, holder: dict[str, Any]) -> None:
        super().__init__(f"{path} is held by {holder or 'another process'}")
        self.path = path
        self.holder = holder


def me(**what: Any) -> dict[str, Any]:
    """A holder record for this process: host and pid, and `what` (e.g. the job or the command)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), **what}


def hold(path: Path, holder: dict[str, Any]) -> int:
    """Lock `path` (created) for this process and write `holder` into it; returns the descriptor,
    whose closing (or this process's death) releases the lock. Locked when another process holds
    it."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held_by = _read(fd)
        os.close(fd)
        raise Locked(path, held_by) from None
    except OSError:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
    return fd


def holder_of(path: Path) -> dict[str, Any] | None:
    """What the process holding `path`'s lock wrote in it ({} before it wrote); None: nobody holds
    it."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return _read(fd)
    finally:
        os.close(fd)  # closing also drops the probe's own lock


def _read(fd: int) -> dict[str, Any]:
    try:
        raw = os.pread(fd, 4096, 0)
        holder = json.loads(raw.decode()) if raw.strip() else {}
        return holder if isinstance(holder, dict) else {}
    except (OSError, ValueError):
        return {}


def dataset_lock(
    directory: Path, part: tuple[int, int] | None = None, command: str = "shardrec preprocess"
) -> int:
    """Hold the lock of a dataset that this process writes (its WORK_DIR is created); one line
    naming the holder (ValueError) when another process (`command`) writes the same one."""
    work = Path(directory) / WORK_DIR
    work.mkdir(parents=True, exist_ok=True)
    path = work / (DATASET_LOCK if part is None else f"{DATASET_LOCK}-part-{part[0]}")
    try:
        return hold(path, me(command=command))
    except Locked as e:
        raise ValueError(
            f"{directory} is being written by {describe_writer(e.holder)} (lock file {path}); "
            "wait for it to end or choose another --out"
        ) from None


def dataset_writer(directory: Path) -> dict[str, Any] | None:
    """The holder of a lock of the dataset in `directory` (None: nobody is writing it)."""
    work = Path(directory) / WORK_DIR
    if not work.is_dir():
        return None
    for path in sorted(work.glob(f"{DATASET_LOCK}*")):
        holder = holder_of(path)
        if holder is not None:
            return holder
    return None


def describe_writer(holder: dict[str, Any]) -> str:
    if not holder:
        return "another process (it has not written its host and pid yet)"
    return f"{holder.get('command', 'a process')} on host {holder.get('host', '?')}, pid {holder.get('pid', '?')}"
