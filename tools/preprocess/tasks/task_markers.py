"""A task's marker file (`.work/task-NNNNN.json`): what the task wrote, written once its parts are
on disk (fsync), so that a rerun skips exactly the finished tasks; the background thread that
syncs a task's parts and then writes its marker while the next task parses."""

from __future__ import annotations

import dataclasses
import json
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from shardrec.dataloader.util.files import atomic_write_bytes, fsync_path
from shardrec.dataloader.util.locks import WORK_DIR
from shardrec.tools.preprocess import cpu_stages

logger = logging.getLogger(__name__)


def marker_path(out: Path, index: int, kind: str = "task") -> Path:
    return out / WORK_DIR / f"{kind}-{index:05d}.json"


def read_marker(out: Path, index: int, kind: str = "task") -> TaskResult | None:
    """The finished task's record, or None when the task must be (re)done: no marker; a marker
    that does not parse (torn by a crash or a full disk on a file system that does not order
    writes); or one whose part files are gone or have another size than it records (a marker of
    the old layout, a folder of files per part, is one that records none: redone).
    kind "staged": the record of a task whose parts wait for their split (gz_stream)."""
    path = marker_path(out, index, kind)
    try:
        result = TaskResult(**json.loads(path.read_bytes()))
        for p in result.parts:
            file = out / p["split"] / p["part"]["name"]
            size = file.stat().st_size if file.is_file() else None
            if size != p["part"]["bytes"]:
                found = (
                    "missing"
                    if size is None
                    else f"{size} bytes, the marker records {p['part']['bytes']}"
                )
                logger.warning("%s: %s; task %d is redone", file, found, index)
                return None
    except FileNotFoundError:
        return None
    except (
        ValueError,
        TypeError,
        KeyError,
    ) as e:  # JSONDecodeError, UnicodeDecodeError: ValueErrors
        logger.warning(
            "%s: unreadable task marker (%s: %s); the task is redone", path, type(e).__name__, e
        )
        return None
    return result


def sync_and_mark(out: Path, result: TaskResult, kind: str = "task") -> None:
    """On the background thread: fsync the result's part files, then write its marker (call
    wait_for_writes() before reading markers)."""
    files = [out / p["split"] / p["part"]["name"] for p in result.parts]
    marker = json.dumps(dataclasses.asdict(result)).encode()
    _PENDING.append(
        _sync_pool().submit(_sync_then_mark, files, marker_path(out, result.index, kind), marker)
    )


_PENDING: list[Future] = []


_POOL: list[ThreadPoolExecutor] = []


def _sync_pool() -> ThreadPoolExecutor:
    if not _POOL:
        _POOL.append(ThreadPoolExecutor(max_workers=1, thread_name_prefix="preprocess-sync"))
    return _POOL[0]


def _sync_then_mark(files: list[Path], marker: Path, payload: bytes) -> None:
    # The marker says "this task's files are complete": it is written only once they are on disk.
    with cpu_stages.stage(cpu_stages.SYNC):
        for path in files:
            fsync_path(path)
        atomic_write_bytes(marker, payload)


def wait_for_writes() -> None:
    """Block until background syncs and markers are done; re-raises an error of theirs."""
    while _PENDING:
        _PENDING.pop(0).result()


@dataclass
class TaskResult:
    index: int
    path: str
    lines: int = 0
    bytes: int = 0
    parts: list[dict] = field(default_factory=list)  # {"split": ..., "part": PartInfo as dict}
    kept: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    errors: list[list] = field(default_factory=list)  # [task-local line, field, value, reason]
    lists_cut: dict[str, list[int]] = field(default_factory=dict)
    """Per list column whose lists some kept row held more than max_length values of:
    [max_length, rows cut, values left out]."""
    bad_lines: list[int] = field(default_factory=list)
    """A staged task's malformed lines (gz_stream splits by them)."""
