"""The project's one atomic file write: temporary name, fsync, rename, fsync of the directory.

Every file shardrec writes (dataset parts and manifests, plans, checkpoints, run files,
figures, preprocess markers) goes through `atomic_path` or one of its two wrappers, so a
reader never sees a half-written file under the final name and a crash after the rename
cannot lose the file: the rename itself is made durable by syncing the directory.

The temporary is `.NAME.tmp-PID` beside the target (same file system, so the rename is
atomic); preprocess removes stale `.*.tmp*` left by a killed run.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "PERMISSION_ERRNOS",
    "SPACE_ERRNOS",
    "WriteError",
    "atomic_open",
    "atomic_path",
    "atomic_write_bytes",
    "fsync_dir",
    "fsync_path",
    "temporary_name",
    "write_error",
]

# The failures of a write that the user fixes where the file goes: space, quota, permission.
SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
PERMISSION_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS}


class WriteError(OSError, ValueError):
    """A write that failed for want of space or permission, as one line naming the path, what
    it needed and what is free. A ValueError too: the commands and the ranks report it as the
    one line of bad input they print, not as a traceback."""

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 100_000 else f"{n:,} bytes"


def space_left(path: Path) -> int | None:
    """Bytes free to this user on the filesystem of `path` (or of its nearest existing parent)."""
    path = Path(path)
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def write_error(
    e: OSError, path: Path, needed: int | None = None, fix: str = "free space or write elsewhere"
) -> OSError:
    """`e` as a WriteError naming `path`, the bytes `needed` (None: unknown) and those free, and
    `fix` (what to do about space), where it failed for want of space or permission; any other
    error as it was."""
    what = os.strerror(e.errno) if e.errno is not None else ""
    if e.errno in SPACE_ERRNOS:
        free = space_left(path)
        need = f"it needs {_mb(needed)}" if needed is not None else "it needs more"
        have = f", {_mb(free)} free there" if free is not None else ""
        return WriteError(e.errno, f"{what}: {need}{have}; {fix}", str(path))
    if e.errno in PERMISSION_ERRNOS:
        need = f" ({_mb(needed)} to write)" if needed is not None else ""
        return WriteError(e.errno, f"{what}{need}; write where you may", str(path))
    return e


def temporary_name(path: Path) -> Path:
    """Where `path` is written before it is renamed into place."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def fsync_path(path: Path) -> None:
    """Flush a file (or a directory) to disk by name."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make renames and creations inside directory `path` durable."""
    fsync_path(path)


@contextmanager
def atomic_path(path: Path, *, fsync: bool = True, sync_dir: bool = True) -> Iterator[Path]:
    """Yield a temporary path to write `path` through; on a clean exit it becomes `path`.

    For writers that want a file name (np.lib.format.open_memmap, savefig). On an error the
    temporary is removed and the error propagates; `path` is left as it was.

    Args:
        fsync: sync the file before the rename and the directory after it. A caller that
            records the file as finished later (preprocess's task marker) may pass False
            and sync the file itself (`fsync_path`) before writing its record.
        sync_dir: with fsync, also sync the directory after the rename. A caller that writes
            many files into one directory before a record of them all (vocabulary mode's count
            runs) passes False and syncs the directory once (`fsync_dir`), before that record:
            one directory sync per file made vocabulary mode's fsyncs twice what they need be.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise write_error(e, path.parent) from e
    tmp = temporary_name(path)
    try:
        yield tmp
        if fsync:
            fsync_path(tmp)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        # A failed write() names no file; an error of another file read inside the block does.
        if isinstance(e, WriteError) or e.filename not in (None, str(tmp), str(path)):
            raise
        raise write_error(e, path) from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync and sync_dir:
        fsync_dir(path.parent)


@contextmanager
def atomic_open(path: Path, *, fsync: bool = True, sync_dir: bool = True) -> Iterator[BinaryIO]:
    """`atomic_path`, opened for binary writing: `with atomic_open(p) as f: f.write(...)`."""
    with atomic_path(path, fsync=fsync, sync_dir=sync_dir) as tmp, open(tmp, "wb") as f:
        yield f


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically and durably; WriteError names the bytes it needed."""
    try:
        with atomic_open(Path(path)) as f:
            f.write(data)
    except OSError as e:
        if e.errno in SPACE_ERRNOS | PERMISSION_ERRNOS:
            raise write_error(e, Path(path), len(data)) from e
        raise
