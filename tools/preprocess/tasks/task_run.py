"""Running one preprocessing task (`run_task`; the task and its options are task.py): read its
text, parse, map ids, write parts.

A task writes its parts, then a marker file (task_markers.py) recording what it wrote; both go
to temporary names first and are renamed, and the marker only once the parts are on disk
(fsync). A rerun skips every task whose marker exists, so a run killed at any point redoes only
unfinished tasks. The parser and the part layout are built once per task from the options and
passed down; the pieces of text come from task_text.py.

Where the CPU goes (hashing mode, numba, one worker; `shardrec bench preprocess` prints it by
stage): the row parser, then hashing ids straight into the part's id columns, the log1p of dense
values, the SHA-256 of every file (taken from memory while it is written) and the copy into the
page cache. Pieces append their rows into the part's final arrays (part_columns.py), so nothing
is concatenated or cast twice.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from shardrec.dataloader.format.manifest import PART_SUFFIX
from shardrec.dataloader.util.files import (
    PERMISSION_ERRNOS,
    SPACE_ERRNOS,
    atomic_write_bytes,
    write_error,
)
from shardrec.tools.preprocess import cpu_stages
from shardrec.tools.preprocess.ids.id_maps import Vocabulary
from shardrec.tools.preprocess.ids.vocab import cached_vocabularies
from shardrec.tools.preprocess.parse import parse_kernel
from shardrec.tools.preprocess.parse.criteo_text import REASONS
from shardrec.tools.preprocess.parse.parquet_rows import (
    describe_bad_row,
    read_row_groups,
    table_chunk,
)
from shardrec.tools.preprocess.parse.text_parser import Chunk
from shardrec.tools.preprocess.parts.part_columns import (
    NonFiniteDense,
    PartColumns,
    ReservedRawIdError,
)
from shardrec.tools.preprocess.parts.part_layout import PartLayout
from shardrec.tools.preprocess.tasks.bad_rows import (
    UnstorableValueError,
    non_finite_error,
    note_bad_rows,
    note_lists_cut,
    place_of,
)
from shardrec.tools.preprocess.tasks.task import STAGED, Task, TaskOptions, split_rows
from shardrec.tools.preprocess.tasks.task_markers import (
    TaskResult,
    marker_path,
    sync_and_mark,
    wait_for_writes,
)
from shardrec.tools.preprocess.tasks.task_text import (
    PARSE_BYTES,
    PIECE_BYTES,
    InputError,
    parse_pieces,
    read_pieces,
)

logger = logging.getLogger(__name__)


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
        path = out / split / f"part-{task.index:05d}-{number:04d}{PART_SUFFIX}"
        try:
            # The write, and the fsync when it is not left to the marker's thread.
            with cpu_stages.stage(cpu_stages.WRITE):
                info = layout.write(buffers[split], path, fsync)
        except OSError as e:
            if e.filename and e.errno not in SPACE_ERRNOS | PERMISSION_ERRNOS:
                raise
            # A failed write() names no file (ENOSPC, EFBIG): name the part being written, and the
            # bytes it needs.
            raise write_error(
                OSError(e.errno, e.strerror, str(path)), path, buffers[split].nbytes
            ) from e
        result.parts.append({"split": split, "part": dataclasses.asdict(info)})
        result.kept[split] = result.kept.get(split, 0) + info.rows
    buffers.clear()


def _capacity(
    task: Task, opts: TaskOptions, piece_rows: int, piece_bytes: int, done_bytes: int
) -> int:
    """Rows to reserve for a new part: the rows per byte of this piece times the text the part
    can still receive (a part closes after chunk_bytes of text, plus the piece that crosses it)."""
    left = opts.chunk_bytes + PIECE_BYTES
    if task.parquet:  # one part per task: its row groups' bytes
        left = task.parquet_bytes - done_bytes
    elif not task.gz:
        left = min(left, task.end - task.start - done_bytes)
    return int(piece_rows * max(left, piece_bytes) / max(piece_bytes, 1) * 1.02) + 1024


def _take_piece(
    task: Task,
    data: memoryview,
    line0: int,
    opts: TaskOptions,
    vocabs: list[Vocabulary] | None,
    layout: PartLayout,
    buffers: dict[str, PartColumns],
    result: TaskResult,
    in_quote: bool,
) -> Chunk:
    """Parse whole lines and append their kept rows to each split's part; returns the parsed
    piece (its rows are the lines; in_quote and its ends_in_quote: text_parser.parse's)."""
    with cpu_stages.stage(cpu_stages.PARSE):
        chunk = opts.parser.parse(data, in_quote)

    def describe(row: int) -> tuple[str, str]:
        return opts.parser.describe_bad(data, chunk, row, path=task.path)

    _take_chunk(task, chunk, describe, len(data), line0, opts, vocabs, layout, buffers, result)
    return chunk


def _take_chunk(
    task: Task,
    chunk: Chunk,
    describe: Callable[[int], tuple[str, str]],
    size: int,
    line0: int,
    opts: TaskOptions,
    vocabs: list[Vocabulary] | None,
    layout: PartLayout,
    buffers: dict[str, PartColumns],
    result: TaskResult,
) -> None:
    """Append a parsed piece's kept rows (`size` bytes of input) to each split's part."""
    with cpu_stages.stage(cpu_stages.APPEND):
        note_bad_rows(task, describe, chunk, line0, result, opts.strict)
        for split, mask in split_rows(task, line0, chunk.rows):
            rows = mask & chunk.ok
            idx = np.arange(chunk.rows) if rows.all() else np.flatnonzero(rows)
            if not len(idx):
                continue
            note_lists_cut(chunk, idx, opts, result.lists_cut)
            if split not in buffers:
                cap = _capacity(task, opts, chunk.rows, size, result.bytes)
                buffers[split] = layout.new_part(cap)
            try:
                layout.append(buffers[split], chunk, idx, vocabs)
            except ReservedRawIdError as e:
                raise UnstorableValueError(
                    f"{place_of(task, line0 + int(idx[e.k]))}: {e}"
                ) from None
            except NonFiniteDense as e:
                raise non_finite_error(place_of(task, line0 + e.row), e, opts) from None
    result.bytes += size


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
    with _small_fresh_pages(hashing=not opts.vocab_path):
        return _run_task(task, opts, background_sync, mark)


@contextmanager
def _small_fresh_pages(hashing: bool) -> Iterator[None]:
    """In hashing mode, numpy's hint to back arrays past 4 MB with huge pages is off while a task
    runs: its arrays are written once, in part, and dropped (a row group's temporaries, a part's
    columns), and each first touch of a 2 MB page zeroes all of it. On a 1 GB Criteo-shaped Parquet
    file (4.2 M rows, one worker) the hint cost ~0.8 of ~4.8 CPU-s, nearly all system time; on its
    text, ~0.2 of 4.6. Vocabulary mode keeps it (its lookups into large tables gain from fewer TLB
    misses; measured within noise)."""
    hint = getattr(np._core.multiarray, "_set_madvise_hugepage", None)  # numpy >= 2.0
    if not hashing or hint is None:
        yield
        return
    before = hint(False)
    try:
        yield
    finally:
        hint(before)


def _run_task(task: Task, opts: TaskOptions, background_sync: bool, mark: bool) -> TaskResult:
    out = Path(opts.out)
    vocabs = cached_vocabularies(Path(opts.vocab_path), opts.names) if opts.vocab_path else None
    layout = opts.part_layout()
    result = TaskResult(task.index, task.path)
    buffers: dict[str, PartColumns] = {}
    line0, parts_written, since_flush = 0, 0, 0
    in_quote = False  # a quoted field's line break crosses a piece's end: the next starts in it
    fsync = mark and not background_sync
    hashing = vocabs is None  # one part per split of a task
    for chunk, describe, size in parquet_chunks(task, opts, hashing):
        _take_chunk(task, chunk, describe, size, line0, opts, vocabs, layout, buffers, result)
        line0 += chunk.rows
    pieces = read_pieces(task.text, blank=opts.parser.blank) if not task.parquet else ()
    for piece in pieces:
        seen = list(result.skipped)
        for data in parse_pieces(piece, PARSE_BYTES if parse_kernel.AVAILABLE else len(piece)):
            chunk = _take_piece(task, data, line0, opts, vocabs, layout, buffers, result, in_quote)
            line0, in_quote = line0 + chunk.rows, chunk.ends_in_quote
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


def parquet_chunks(
    task: Task, opts: TaskOptions, hashing: bool = False
) -> Iterator[tuple[Chunk, Callable[[int], tuple[str, str]], int]]:
    """A Parquet task's row groups, each decoded (parquet_rows.table_chunk), with what names a
    malformed row and its uncompressed bytes; nothing for a task of text. hashing: the chunks are
    hashed into ids (not counted, not looked up in vocabularies)."""
    if not task.parquet:
        return
    pp = opts.parser.parquet
    groups = read_row_groups(Path(task.path), task.start, task.end, pp)
    while True:
        with cpu_stages.stage(cpu_stages.READ):
            table, size = next(groups, (None, 0))
        if table is None:
            return
        with cpu_stages.stage(cpu_stages.PARSE):
            chunk = table_chunk(table, pp, hashing=hashing)

        def describe(row: int, table=table, chunk=chunk) -> tuple[str, str]:
            return describe_bad_row(table, chunk, row, pp)

        yield chunk, describe, size


def process_setup() -> None:
    """Once per process that preprocesses (the CLI's, each pool worker): its start-up and the
    kernels' loading are counted as such (cpu_stages), and its exit skips the last collection."""
    if _SET_UP:
        return
    _SET_UP.append(True)
    # At exit the interpreter collects garbage over every object numba's registries made,
    # ~0.3 CPU-s per process, to free memory the process gives back anyway; frozen objects
    # are not scanned. Registered now, it runs only as the process ends (pytest's too).
    atexit.register(gc.freeze)
    # Loading the first kernel makes ~50 K objects (numba's registries) that live as long as the
    # process: collected while they are made, they were scanned again and again (~0.05 CPU-s,
    # a full collection among them); frozen once made, no later collection scans them.
    gc.disable()
    try:
        cpu_stages.process_started(parse_kernel.warm_up)
    finally:
        gc.freeze()
        gc.enable()


_SET_UP: list[bool] = []


def run_task_safely(
    task: Task, opts: TaskOptions, background_sync: bool = False
) -> tuple[TaskResult | str, dict[str, float]]:
    """run_task, with an unreadable input's one line as the result instead of an exception, and
    what the task cost per stage (the process's own counts, cpu_stages)."""
    # An unreadable input fails its own task only; malformed rows under --strict stop the run.
    # What the task cost per stage goes back with it (a pool worker's own counts; cpu_stages).
    try:
        res: TaskResult | str = run_task(task, opts, background_sync)
    except InputError as e:
        res = str(e)
    return res, cpu_stages.take()
