"""One preprocessing task: read a byte range (or a gzip file), parse, map ids, write parts.

A task writes its parts, then a marker file (`.work/task-NNNNN.json`) recording what it
wrote; both go to temporary names first and are renamed, and the marker only once the parts
are on disk (fsync). A rerun skips every task whose marker exists, so a run killed at any
point redoes only unfinished tasks.

Where the CPU goes (hashing mode, numba, one worker): the row parser is about 35-40%; the rest is
hashing ids straight into the part's id columns, the log1p of dense values, the SHA-256 of
every file (taken from memory while it is written) and the copy into the page cache. Pieces
append their rows into the part's final arrays (part_columns.py), so nothing is
concatenated or cast twice.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import json
import logging
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from shardrec.dataloader.util.files import atomic_write_bytes, fsync_path
from shardrec.tools.preprocess import cpu_stages
from shardrec.tools.preprocess.ids.id_maps import Vocabulary
from shardrec.tools.preprocess.ids.vocab import cached_vocabularies
from shardrec.tools.preprocess.inputs import STAGED, Task
from shardrec.tools.preprocess.parse import parse_kernel
from shardrec.tools.preprocess.parse.criteo_text import REASONS
from shardrec.tools.preprocess.parts.part_columns import PartColumns
from shardrec.tools.preprocess.pieces import (
    Chunk,
    PartLayout,
    TaskOptions,
    describe_bad,
    parse_piece,
)
from shardrec.tools.preprocess.task_text import slot_pieces
from shardrec.tools.preprocess.text.gz import (
    RAPIDGZIP_ERRORS,
    READ_ERRORS,
    crc32,
    describe_error,
    open_range,
    open_text,
)
from shardrec.tools.preprocess.text.lines import count_range_lines, header_end

logger = logging.getLogger(__name__)
MAX_REPORTED = 5
PIECE_BYTES = 16 << 20  # text read at once (and parsed at once by the numpy fallback)
# Text the compiled parser takes at once: its per-row arrays (~1.5x the text) stay below the
# allocator's mmap threshold, so they are reused instead of faulted in and zeroed for every
# piece, and are still in cache when hashing and the dense transform read them.
PARSE_BYTES = 2 << 20
WORK_DIR = ".work"


class MalformedRowError(ValueError):
    """A malformed row under --strict; the message is `file:line: field: value (reason)`."""


class InputError(ValueError):
    """An input file that cannot be read to the end (truncated gzip, I/O error)."""


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
    bad_lines: list[int] = field(
        default_factory=list
    )  # a staged task's malformed lines (gz_stream splits by them)


def marker_path(out: Path, index: int, kind: str = "task") -> Path:
    return out / WORK_DIR / f"{kind}-{index:05d}.json"


def read_marker(out: Path, index: int, kind: str = "task") -> TaskResult | None:
    """The finished task's record, or None when the task must be (re)done: no marker; a marker
    that does not parse (torn by a crash or a full disk on a file system that does not order
    writes); or one whose part files are gone or have another size than it records.
    kind "staged": the record of a task whose parts wait for their split (gz_stream)."""
    path = marker_path(out, index, kind)
    try:
        result = TaskResult(**json.loads(path.read_bytes()))
        for p in result.parts:
            for name, info in p["part"]["files"].items():
                file = out / p["split"] / p["part"]["name"] / name
                size = file.stat().st_size if file.is_file() else None
                if size != info["bytes"]:
                    found = (
                        "missing"
                        if size is None
                        else f"{size} bytes, the marker records {info['bytes']}"
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


class _Source:
    """The task's text as a readinto-able stream: a byte range of a plain file, a range of a gzip
    file's text (checked against the CRC-32 the planning pass took), or a whole gzip file."""

    def __init__(self, task: Task) -> None:
        self.task, self.left = task, (task.end - task.start) if task.end >= 0 else -1
        self.crc = 0

    def __enter__(self) -> _Source:
        self.f = None
        t = self.task
        try:
            if t.gz and t.end >= 0:
                self.f = open_range(t.path, t.start, t.end, t.gz_index)
            else:
                self.f = open_text(t.path)
            if t.gz and t.end < 0 and t.header:
                self.f.readline()
            elif not t.gz:
                self.f.seek(t.start)
        except (*READ_ERRORS, *RAPIDGZIP_ERRORS) as e:
            raise InputError(describe_error(t.path, e, self.f)) from e
        return self

    def __exit__(self, *exc) -> None:
        if self.f is not None:
            self.f.close()

    def readinto(self, view: memoryview) -> int:
        if self.left >= 0:
            view = view[: min(len(view), self.left)]
        try:
            n = self.f.readinto(view) if len(view) else 0
        except (*READ_ERRORS, *RAPIDGZIP_ERRORS) as e:
            raise InputError(describe_error(self.task.path, e, self.f)) from e
        if self.left >= 0:
            self.left -= n
            if self.task.crc >= 0:
                self._check(view[:n], n)
        return n

    def _check(self, data: memoryview, n: int) -> None:
        # A range decoded through a seek index counts only if it is the text the planning pass cut.
        t = self.task
        self.crc = crc32(data, self.crc)
        if (n == 0 and self.left > 0) or (self.left == 0 and self.crc != t.crc):
            got = (
                f"{t.end - t.start - self.left:,} bytes"
                if self.left > 0
                else f"CRC-32 {self.crc:08x}, the plan has {t.crc:08x}"
            )
            raise InputError(
                f"{t.path}: text bytes {t.start:,}-{t.end:,} read back differ from the planning pass ({got}); "
                f"remove {Path(t.gz_index).parent if t.gz_index else 'the .work/gzip directory'} and rerun"
            )


def read_pieces(task: Task, piece_bytes: int = PIECE_BYTES) -> Iterator[memoryview]:
    """The task's text in pieces of about `piece_bytes` that end at a newline.

    Pieces are views of one reused buffer (no copies): each is valid until the next is read.
    """
    if task.text_slot:  # already decoded, in shared memory (gz_stream): read in place
        yield from slot_pieces(task, piece_bytes)
        return
    buf = bytearray(piece_bytes + 1)
    have = 0  # bytes of an unfinished line carried over from the previous read
    with _Source(task) as src:
        while True:
            if have >= len(buf) - 1:  # a line longer than the buffer: grow it (a new one, as
                bigger = bytearray(2 * len(buf))  # views of the old may still be alive)
                bigger[:have] = buf[:have]
                buf = bigger
            with cpu_stages.stage(cpu_stages.READ):
                n = src.readinto(memoryview(buf)[have : len(buf) - 1])
                total = have + n
                cut = buf.rfind(b"\n", 0, total) + 1 if n else 0
            if n == 0:
                break
            if cut:
                yield memoryview(buf)[:cut]
                with cpu_stages.stage(cpu_stages.READ):
                    buf[: total - cut] = buf[cut:total]
            have = total - cut
    if have:
        buf[have] = 10  # the last line had no newline
        yield memoryview(buf)[: have + 1]


def _absolute_line(task: Task, local: int) -> int:
    """1-based physical line number in the file (a header counts as line 1)."""
    first = task.first_line
    if first < 0:
        begin = header_end(Path(task.path)) if task.header else 0
        first = count_range_lines(Path(task.path), begin, task.start)
    return first + local + 1 + int(task.header)


def _note_bad_rows(
    task: Task, data: bytes, chunk: Chunk, line0: int, result: TaskResult, opts: TaskOptions
) -> None:
    bad = np.flatnonzero(~chunk.ok)
    if not len(bad):
        return
    codes, counts = np.unique(chunk.reason[bad], return_counts=True)
    for c, n in zip(codes, counts):
        result.skipped[REASONS[c]] = result.skipped.get(REASONS[c], 0) + int(n)
    if task.default_split == STAGED:
        result.bad_lines.extend((line0 + bad).tolist())
    for row in bad[: max(0, MAX_REPORTED - len(result.errors))]:
        name, value = describe_bad(data, chunk, int(row), opts)
        result.errors.append([line0 + int(row), name, value, REASONS[chunk.reason[row]]])
    if opts.strict:
        local, name, value, reason = result.errors[0]
        line = _absolute_line(task, local)
        raise MalformedRowError(f"{task.path}:{line}: {name}: {value} ({reason})")


def split_rows(task: Task, line0: int, n: int) -> list[tuple[str, np.ndarray]]:
    """(split, row mask) for each split present in lines [line0, line0 + n) of the task."""
    if not task.splits:
        return [(task.default_split, np.ones(n, dtype=bool))]
    lines = task.first_line + line0 + np.arange(n) if task.first_line >= 0 else line0 + np.arange(n)
    out = []
    for r in task.splits:
        mask = (lines >= r.begin) & (lines < r.end)
        if mask.any():
            out.append((r.split, mask))
    return out


def _flush(
    out: Path,
    task: Task,
    number: int,
    buffers: dict[str, PartColumns],
    result: TaskResult,
    layout: PartLayout,
    fsync: bool,
) -> None:
    for split in sorted(buffers):
        part_dir = out / split / f"part-{task.index:05d}-{number:04d}"
        try:
            with cpu_stages.stage(
                cpu_stages.WRITE
            ):  # and the fsyncs, when not left to _sync_then_mark
                info = layout.write(buffers[split], part_dir, fsync)
        except OSError as e:
            if e.filename:
                raise
            # A failed write() names no file (ENOSPC, EFBIG): name the part being written.
            raise OSError(e.errno, e.strerror, str(part_dir)) from e
        result.parts.append({"split": split, "part": dataclasses.asdict(info)})
        result.kept[split] = result.kept.get(split, 0) + info.rows
    buffers.clear()


def _capacity(
    task: Task, opts: TaskOptions, piece_rows: int, piece_bytes: int, done_bytes: int
) -> int:
    """Rows to reserve for a new part: the rows per byte of this piece times the text the part
    can still receive (a part closes after chunk_bytes of text, plus the piece that crosses it)."""
    left = opts.chunk_bytes + PIECE_BYTES
    if not task.gz:
        left = min(left, task.end - task.start - done_bytes)
    return int(piece_rows * max(left, piece_bytes) / max(piece_bytes, 1) * 1.02) + 1024


def _parse_pieces(data: memoryview, size: int) -> Iterator[memoryview]:
    """Whole lines of `data` in views of about `size` bytes, each ending at a newline."""
    arr = np.frombuffer(data, dtype=np.uint8)
    start, n = 0, len(arr)
    while n - start > size:
        with cpu_stages.stage(cpu_stages.READ):
            end = start + size
            lo = max(start, end - 4096)  # lines are short: look back a little first
            nl = np.flatnonzero(arr[lo:end] == 10)
            if not len(nl):
                lo = start
                nl = np.flatnonzero(arr[lo:end] == 10)
            cut = lo + int(nl[-1]) + 1 if len(nl) else end + int(np.argmax(arr[end:] == 10)) + 1
        yield data[start:cut]
        start = cut
    if start < n:
        yield data[start:]


def _take_piece(
    task: Task,
    data: memoryview,
    line0: int,
    opts: TaskOptions,
    vocabs: list[Vocabulary] | None,
    layout: PartLayout,
    buffers: dict[str, PartColumns],
    result: TaskResult,
) -> int:
    """Parse whole lines and append their kept rows to each split's part; returns the lines."""
    with cpu_stages.stage(cpu_stages.PARSE):
        chunk = parse_piece(data, opts)
    with cpu_stages.stage(cpu_stages.APPEND):
        _note_bad_rows(task, data, chunk, line0, result, opts)
        for split, mask in split_rows(task, line0, chunk.rows):
            rows = mask & chunk.ok
            idx = np.arange(chunk.rows) if rows.all() else np.flatnonzero(rows)
            if not len(idx):
                continue
            if split not in buffers:
                cap = _capacity(task, opts, chunk.rows, len(data), result.bytes)
                buffers[split] = layout.new_part(cap)
            layout.append(buffers[split], chunk, idx, vocabs)
    result.bytes += len(data)
    return chunk.rows


def run_task(
    task: Task, opts: TaskOptions, background_sync: bool = False, mark: bool = True
) -> TaskResult:
    """Parse and write one task; writes its marker last. Returns what the marker holds.

    Text is read in pieces of PIECE_BYTES, parsed in pieces of PARSE_BYTES (compiled parser)
    and written as one part per split per `chunk_bytes` of text read.

    background_sync: return once the parts are written and renamed; their fsync and then the
    marker happen on a background thread while the caller parses the next task (call
    wait_for_writes() before reading markers). Only for tasks run in the calling process: a
    pool worker could be stopped before its thread finishes.
    mark=False: return once the parts are written and renamed, neither synced nor marked: the
    caller passes the result to sync_and_mark (gz_stream: a pool worker's parts, synced by the
    main process while the worker parses its next range).
    """
    process_setup()
    out = Path(opts.out)
    vocabs = cached_vocabularies(Path(opts.vocab_path), opts.names) if opts.vocab_path else None
    layout = PartLayout(opts)
    result = TaskResult(task.index, task.path)
    buffers: dict[str, PartColumns] = {}
    line0, parts_written, since_flush = 0, 0, 0
    fsync = mark and not background_sync
    for piece in read_pieces(task):
        seen = list(result.skipped)
        for data in _parse_pieces(piece, PARSE_BYTES if parse_kernel.AVAILABLE else len(piece)):
            line0 += _take_piece(task, data, line0, opts, vocabs, layout, buffers, result)
        # Reasons first met in this piece are listed in REASONS order, as when a read piece was
        # parsed at once: the manifest's bytes do not depend on PARSE_BYTES.
        new = sorted((k for k in result.skipped if k not in seen), key=REASONS.index)
        result.skipped = {k: result.skipped[k] for k in seen + new}
        since_flush += len(piece)  # parts close on read pieces, as they always have
        if since_flush >= opts.chunk_bytes:
            _flush(out, task, parts_written, buffers, result, layout, fsync)
            parts_written, since_flush = parts_written + 1, 0
    if buffers:
        _flush(out, task, parts_written, buffers, result, layout, fsync)
    result.lines = line0
    kind = "staged" if task.default_split == STAGED else "task"
    if not mark:
        return result
    if background_sync:
        # at most one task in flight: its files stay bounded, errors surface early
        wait_for_writes()
        sync_and_mark(out, result, kind)
        return result
    with cpu_stages.stage(cpu_stages.SYNC):
        atomic_write_bytes(
            marker_path(out, task.index, kind), json.dumps(dataclasses.asdict(result)).encode()
        )
    return result


def sync_and_mark(out: Path, result: TaskResult, kind: str = "task") -> None:
    """On the background thread: fsync the result's part files, then write its marker (call
    wait_for_writes() before reading markers)."""
    files = [
        out / p["split"] / p["part"]["name"] / f for p in result.parts for f in p["part"]["files"]
    ]
    marker = json.dumps(dataclasses.asdict(result)).encode()
    _PENDING.append(
        _sync_pool().submit(_sync_then_mark, files, marker_path(out, result.index, kind), marker)
    )


def process_setup() -> None:
    """Once per process that preprocesses (the CLI's, each pool worker): its start-up and the
    kernels' loading are counted as such (cpu_stages), and its exit skips the last collection."""
    if not _SET_UP:
        _SET_UP.append(True)
        # At exit the interpreter collects garbage over every object numba's registries made,
        # ~0.3 CPU-s per process, to free memory the process gives back anyway; frozen objects
        # are not scanned. Registered now, it runs only as the process ends (pytest's too).
        atexit.register(gc.freeze)
    cpu_stages.process_started(parse_kernel.warm_up)


_SET_UP: list[bool] = []
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
