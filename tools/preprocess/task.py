"""A preprocessing task: what it is (`Task`, a byte range of a plain file, a range of a gzip
file's text or a whole gzip file, with the split of each line), what every task of a run shares
(`TaskOptions`: the parser, table sizes, transforms), and running one (`run_task`): read its
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
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from shardrec.dataloader.format.manifest import PART_SUFFIX, SparseFeature, smallest_uint
from shardrec.dataloader.format.part_file import file_layout
from shardrec.dataloader.format.raw_ids import RAW
from shardrec.dataloader.spec.feature_spec import ListColumn, SequenceColumn
from shardrec.dataloader.util.files import (
    PERMISSION_ERRNOS,
    SPACE_ERRNOS,
    atomic_write_bytes,
    write_error,
)
from shardrec.dataloader.util.locks import WORK_DIR
from shardrec.tools.preprocess import cpu_stages
from shardrec.tools.preprocess.ids.id_maps import Vocabulary
from shardrec.tools.preprocess.ids.vocab import (
    DEFAULT_MEMORY_MB,
    cached_vocabularies,
)
from shardrec.tools.preprocess.parse import parse_kernel
from shardrec.tools.preprocess.parse.criteo_text import REASONS
from shardrec.tools.preprocess.parse.parquet_rows import (
    describe_bad_row,
    read_row_groups,
    table_chunk,
)
from shardrec.tools.preprocess.parse.text_parser import Chunk, TextParser
from shardrec.tools.preprocess.parts.part_columns import (
    NonFiniteDense,
    PartColumns,
    ReservedRawIdError,
)
from shardrec.tools.preprocess.parts.part_layout import PartLayout
from shardrec.tools.preprocess.task_markers import (
    TaskResult,
    marker_path,
    sync_and_mark,
    wait_for_writes,
)
from shardrec.tools.preprocess.task_text import (
    PARSE_BYTES,
    PIECE_BYTES,
    InputError,
    TextRange,
    parse_pieces,
    read_pieces,
)
from shardrec.tools.preprocess.text.lines import count_range_lines, header_end

logger = logging.getLogger(__name__)
MAX_REPORTED = 5


# Where a task puts its parts while its file's line count, hence its split, is unknown (gz_stream).
STAGED = f"{WORK_DIR}/staged"


@dataclass(frozen=True)
class SplitRange:
    """Lines [begin, end) of one file go to `split`."""

    split: str
    begin: int
    end: int


@dataclass(frozen=True)
class Task:
    """One unit of work: a byte range of a plain file, a range of a gzip file's text, or a whole
    gzip file."""

    index: int
    path: str
    start: int
    end: int
    """-1: to the end (gzip files)."""
    first_line: int
    """Line number (0-based, after any header) of the range's first line; -1 if unknown."""
    splits: tuple[SplitRange, ...]
    """By line number within the file; empty: the whole file is `default_split`."""
    default_split: str
    header: bool
    """The file starts with a header line (plain ranges already start past it)."""
    gz_index: str = ""
    """A range of a gzip file's text: its seek index (gz_split), "" for none."""
    crc: int = -1
    """A range of a gzip file's text: CRC-32 of its bytes, from the planning pass."""
    text_slot: str = ""
    """A range of a gzip file's text already decoded: its shared memory (gz_stream)."""
    parquet_bytes: int = -1
    """A Parquet file's row groups [start, end) (their uncompressed bytes; parquet_rows.py), not
    a byte range of text; -1: text."""

    @property
    def gz(self) -> bool:
        return self.path.endswith(".gz")

    @property
    def parquet(self) -> bool:
        return self.parquet_bytes >= 0

    @property
    def holds_train_lines(self) -> bool:
        """Whether any of the task's lines may be a training line (a task of the last day, or of
        Kaggle's seventh, holds none: the vocabulary pass does not read it)."""
        if not self.splits:
            return self.default_split == "train"
        first = max(self.first_line, 0)  # lines only grow from the task's first one
        return any(r.split == "train" and r.end > first for r in self.splits)

    def split_of(self, line: int) -> str:
        for r in self.splits:
            if r.begin <= line < r.end:
                return r.split
        return self.default_split

    @property
    def text(self) -> TextRange:
        """Where the task's text is, as reading it needs."""
        return TextRange(
            self.path, self.start, self.end, self.header, self.gz_index, self.crc, self.text_slot
        )

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TaskOptions:
    """What every task of one run shares (picklable, sent to worker processes)."""

    out: str
    parser: TextParser
    chunk_bytes: int
    cardinalities: tuple[int, ...]
    """Hashing mode: one per sparse feature; vocabulary mode: from the vocabularies."""
    vocab_path: str = ""
    """Vocabulary mode: the directory of memory-mapped vocabularies (vocab.py)."""
    dense_transform: str = "log1p"
    dense_dtype: str = "float32"
    strict: bool = False
    vocab_memory_bytes: int = DEFAULT_MEMORY_MB << 20
    """Vocabulary mode: pairs a counting task holds before it spills."""

    @property
    def names(self) -> list[str]:
        """Every sparse feature, in manifest order."""
        return self.parser.sparse_names

    def features(self) -> list[SparseFeature]:
        """Every sparse feature as the manifest records it (less its statistics): name, table rows,
        id dtype, and for a spec's list columns their pooling."""
        features = [
            SparseFeature(n, c, str(smallest_uint(c - 1)))
            if c
            else SparseFeature(n, 0, "uint64", ids=RAW)
            for n, c in zip(self.names, self.cardinalities)
        ]
        columns = self.parser.program.spec.sparse if self.parser.program else []
        for f, column in zip(features, columns):
            if isinstance(column, ListColumn):
                f.multi_hot, f.pooling = True, column.pooling
            f.table = column.table
            if isinstance(column, SequenceColumn):
                f.sequence, f.side_of = True, column.side_of
                f.values = column.values
        return features

    def part_layout(self) -> PartLayout:
        """The columns of the parts a task writes, from the run's table sizes and transforms."""
        p = self.parser
        return PartLayout(
            p.program,
            p.sparse_names,
            p.num_dense,
            self.cardinalities,
            self.dense_transform,
            self.dense_dtype,
            file_layout(p.dense_names, self.dense_dtype, self.features()),
        )


class MalformedRowError(ValueError):
    """A malformed row under --strict; the message is `file:line: field: value (reason)`."""


def _absolute_line(task: Task, local: int) -> int:
    """1-based physical line number in the file (a header counts as line 1); a Parquet file's
    row number, from 1."""
    first = task.first_line
    if first < 0:
        begin = header_end(Path(task.path)) if task.header else 0
        first = count_range_lines(Path(task.path), begin, task.start)
    return first + local + 1 + int(task.header)


def _note_bad_rows(
    task: Task,
    describe: Callable[[int], tuple[str, str]],
    chunk: Chunk,
    line0: int,
    result: TaskResult,
    strict: bool,
) -> None:
    """Count a piece's malformed rows by reason and keep the first ones as (line, field, value,
    reason); describe(row): the field and value of a malformed row of the piece."""
    bad = np.flatnonzero(~chunk.ok)
    if not len(bad):
        return
    codes, counts = np.unique(chunk.reason[bad], return_counts=True)
    for c, n in zip(codes, counts):
        result.skipped[REASONS[c]] = result.skipped.get(REASONS[c], 0) + int(n)
    if task.default_split == STAGED:
        result.bad_lines.extend((line0 + bad).tolist())
    for row in bad[: max(0, MAX_REPORTED - len(result.errors))]:
        name, value = describe(int(row))
        result.errors.append([line0 + int(row), name, value, REASONS[chunk.reason[row]]])
    if strict:
        local, name, value, reason = result.errors[0]
        raise MalformedRowError(f"{_where(task, local)}: {name}: {value} ({reason})")


def _where(task: Task, local: int) -> str:
    """`file:line` of a task's line (a Parquet file's: `file: row N`)."""
    line = _absolute_line(task, local)
    return f"{task.path}: row {line}" if task.parquet else f"{task.path}:{line}"


def non_finite_error(
    where: str, e: NonFiniteDense, opts: TaskOptions, scoring: bool = False
) -> ValueError:
    """The one line for a dense value its part cannot hold: `where` (file and line or row), column,
    value, and the fix (preprocessing); `scoring`: rows scored by a model, whose transform is
    fixed."""
    name = opts.parser.dense_names[e.column]
    if scoring:
        return ValueError(
            f"{where}: {name}: {e.value:g} is past what {opts.dense_dtype} holds with "
            "transform none, as the model's data was stored: the model would score infinity"
        )
    log = (
        f'give {name} transform = "signed-log1p" in the spec'
        if opts.parser.program
        else "preprocess with --dense-transform signed-log1p"
    )
    fits_float32 = abs(e.value) <= np.finfo(np.float32).max
    fix = f"drop --float16, or {log}" if opts.dense_dtype == "float16" and fits_float32 else log
    return ValueError(
        f"{where}: {name}: {e.value:g} is past what {opts.dense_dtype} holds with "
        f"transform none: it would train as infinity; {fix}"
    )


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
) -> int:
    """Parse whole lines and append their kept rows to each split's part; returns the lines."""
    with cpu_stages.stage(cpu_stages.PARSE):
        chunk = opts.parser.parse(data)

    def describe(row: int) -> tuple[str, str]:
        return opts.parser.describe_bad(data, chunk, row, path=task.path)

    _take_chunk(task, chunk, describe, len(data), line0, opts, vocabs, layout, buffers, result)
    return chunk.rows


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
        _note_bad_rows(task, describe, chunk, line0, result, opts.strict)
        for split, mask in split_rows(task, line0, chunk.rows):
            rows = mask & chunk.ok
            idx = np.arange(chunk.rows) if rows.all() else np.flatnonzero(rows)
            if not len(idx):
                continue
            if split not in buffers:
                cap = _capacity(task, opts, chunk.rows, size, result.bytes)
                buffers[split] = layout.new_part(cap)
            try:
                layout.append(buffers[split], chunk, idx, vocabs)
            except ReservedRawIdError as e:
                raise ValueError(f"{_where(task, line0 + int(idx[e.k]))}: {e}") from None
            except NonFiniteDense as e:
                raise non_finite_error(_where(task, line0 + e.row), e, opts) from None
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
    fsync = mark and not background_sync
    hashing = vocabs is None  # one part per split of a task
    for chunk, describe, size in parquet_chunks(task, opts, hashing):
        _take_chunk(task, chunk, describe, size, line0, opts, vocabs, layout, buffers, result)
        line0 += chunk.rows
    for piece in read_pieces(task.text) if not task.parquet else ():
        seen = list(result.skipped)
        for data in parse_pieces(piece, PARSE_BYTES if parse_kernel.AVAILABLE else len(piece)):
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
    if not _SET_UP:
        _SET_UP.append(True)
        # At exit the interpreter collects garbage over every object numba's registries made,
        # ~0.3 CPU-s per process, to free memory the process gives back anyway; frozen objects
        # are not scanned. Registered now, it runs only as the process ends (pytest's too).
        atexit.register(gc.freeze)
    cpu_stages.process_started(parse_kernel.warm_up)


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
