"""One preprocessing task: read a byte range (or a gzip file), parse, map ids, write parts.

A task writes its parts, then a marker file (`.work/task-NNNNN.json`) recording what it
wrote; both go to temporary names first and are renamed. A rerun skips every task whose
marker exists, so a run killed at any point redoes only unfinished tasks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from shardrec.dataloader.format import atomic_write_bytes, smallest_uint, write_part
from shardrec.tools import parse_kernel
from shardrec.tools.criteo_parse import REASONS, Schema, describe_bad_row, parse_chunk, transform_dense
from shardrec.tools.preprocess_ids import Vocabulary, count_values, hash_ids, load_vocabularies, merge_counts
from shardrec.tools.preprocess_plan import Task, count_range_lines, header_end, open_text

MAX_REPORTED = 5
PIECE_BYTES = 16 << 20  # text parsed at once: big enough for numpy, small enough for caches
WORK_DIR = ".work"


class MalformedRowError(ValueError):
    """A malformed row under --strict; the message is `file:line: field: value (reason)`."""


class InputError(ValueError):
    """An input file that cannot be read to the end (truncated gzip, I/O error)."""


@dataclass(frozen=True)
class TaskOptions:
    """What every task of one run shares (picklable, sent to worker processes)."""

    out: str
    schema: Schema
    chunk_bytes: int
    cardinalities: tuple[int, ...]  # hashing mode: one per sparse feature; vocab mode: from the vocabularies
    vocab_path: str = ""  # vocabulary mode: the .npz written after counting
    dense_transform: str = "log1p"
    dense_dtype: str = "float32"
    strict: bool = False


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


def marker_path(out: Path, index: int, kind: str = "task") -> Path:
    return out / WORK_DIR / f"{kind}-{index:05d}.json"


class _Source:
    """The task's text as a readinto-able stream: a byte range of a plain file, or a gzip file."""

    def __init__(self, task: Task) -> None:
        self.task, self.left = task, (task.end - task.start) if not task.gz else -1

    def __enter__(self) -> "_Source":
        try:
            self.f = open_text(self.task.path)
            if self.task.gz and self.task.header:
                self.f.readline()
            elif not self.task.gz:
                self.f.seek(self.task.start)
        except (EOFError, OSError, zlib.error) as e:
            raise InputError(f"{self.task.path}: unreadable or truncated: {e}") from e
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()

    def readinto(self, view: memoryview) -> int:
        if self.left >= 0:
            view = view[: min(len(view), self.left)]
        try:
            n = self.f.readinto(view)
        except (EOFError, OSError, zlib.error) as e:
            raise InputError(f"{self.task.path}: unreadable or truncated: {e}") from e
        if self.left >= 0:
            self.left -= n
        return n


def read_pieces(task: Task, piece_bytes: int = PIECE_BYTES) -> Iterator[memoryview]:
    """The task's text in pieces of about `piece_bytes` that end at a newline.

    Pieces are views of one reused buffer (no copies): each is valid until the next is read.
    """
    buf = bytearray(piece_bytes + 1)
    have = 0  # bytes of an unfinished line carried over from the previous read
    with _Source(task) as src:
        while True:
            if have >= len(buf) - 1:  # a line longer than the buffer: grow it (a new one, as
                bigger = bytearray(2 * len(buf))  # views of the old may still be alive)
                bigger[:have] = buf[:have]
                buf = bigger
            n = src.readinto(memoryview(buf)[have : len(buf) - 1])
            total = have + n
            if n == 0:
                break
            cut = buf.rfind(b"\n", 0, total) + 1
            if cut:
                yield memoryview(buf)[:cut]
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


def _note_bad_rows(task: Task, data: bytes, chunk, line0: int, result: TaskResult, opts: TaskOptions) -> None:
    bad = np.flatnonzero(~chunk.ok)
    if not len(bad):
        return
    codes, counts = np.unique(chunk.reason[bad], return_counts=True)
    for c, n in zip(codes, counts):
        result.skipped[REASONS[c]] = result.skipped.get(REASONS[c], 0) + int(n)
    for row in bad[: max(0, MAX_REPORTED - len(result.errors))]:
        name, value = describe_bad_row(data, chunk, int(row), opts.schema)
        result.errors.append([line0 + int(row), name, value, REASONS[chunk.reason[row]]])
    if opts.strict:
        local, name, value, reason = result.errors[0]
        line = _absolute_line(task, local)
        raise MalformedRowError(f"{task.path}:{line}: {name}: {value} ({reason})")


def map_ids(chunk, opts: TaskOptions, vocabs: list[Vocabulary] | None) -> dict[str, np.ndarray]:
    names, cards = opts.schema.sparse_names, opts.cardinalities
    if vocabs is None and parse_kernel.AVAILABLE:
        ids = parse_kernel.hash_matrix(chunk.sparse, chunk.sparse_missing, np.asarray(cards, dtype=np.int64))
        return {n: ids[:, f].astype(smallest_uint(cards[f] - 1)) for f, n in enumerate(names)}
    out = {}
    for f, name in enumerate(names):
        values, missing = chunk.sparse[:, f], chunk.sparse_missing[:, f]
        ids = vocabs[f].lookup(values, missing) if vocabs else hash_ids(values, missing, cards[f])
        out[name] = ids.astype(smallest_uint(cards[f] - 1))
    return out


def _split_rows(task: Task, line0: int, n: int) -> list[tuple[str, np.ndarray]]:
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


class _PartBuffer:
    """Rows of one split gathered from several pieces until a part is written."""

    def __init__(self) -> None:
        self.labels: list[np.ndarray] = []
        self.dense: list[np.ndarray] = []
        self.ids: list[dict[str, np.ndarray]] = []

    def add(self, labels: np.ndarray, dense: np.ndarray, ids: dict[str, np.ndarray]) -> None:
        self.labels.append(labels)
        self.dense.append(dense)
        self.ids.append(ids)

    def write(self, part_dir: Path):
        names = self.ids[0].keys()
        ids = {n: np.concatenate([i[n] for i in self.ids]) for n in names}
        return write_part(part_dir, np.concatenate(self.labels), np.concatenate(self.dense), ids)


def _flush(out: Path, task: Task, number: int, buffers: dict[str, _PartBuffer], result: TaskResult) -> None:
    for split in sorted(buffers):
        info = buffers[split].write(out / split / f"part-{task.index:05d}-{number:04d}")
        result.parts.append({"split": split, "part": dataclasses.asdict(info)})
        result.kept[split] = result.kept.get(split, 0) + info.rows
    buffers.clear()


def run_task(task: Task, opts: TaskOptions) -> TaskResult:
    """Parse and write one task; writes its marker last. Returns what the marker holds.

    Text is parsed in pieces of PIECE_BYTES (small arrays stay in the allocator's reuse
    range) and written as one part per split per `chunk_bytes` of text.
    """
    out = Path(opts.out)
    vocabs = _load_vocabs(opts)
    result = TaskResult(task.index, task.path)
    buffers: dict[str, _PartBuffer] = {}
    line0, parts_written, since_flush = 0, 0, 0
    for data in read_pieces(task):
        chunk = parse_chunk(data, opts.schema)
        _note_bad_rows(task, data, chunk, line0, result, opts)
        dense = transform_dense(chunk.dense, chunk.dense_missing, opts.dense_transform, opts.dense_dtype)
        ids = map_ids(chunk, opts, vocabs)
        for split, mask in _split_rows(task, line0, chunk.rows):
            rows = mask & chunk.ok
            if rows.all():  # the common case: no copies
                buffers.setdefault(split, _PartBuffer()).add(chunk.labels, dense, ids)
            elif rows.any():
                buffers.setdefault(split, _PartBuffer()).add(chunk.labels[rows], dense[rows], {k: v[rows] for k, v in ids.items()})
        line0 += chunk.rows
        result.bytes += len(data)
        since_flush += len(data)
        if since_flush >= opts.chunk_bytes:
            _flush(out, task, parts_written, buffers, result)
            parts_written, since_flush = parts_written + 1, 0
    if buffers:
        _flush(out, task, parts_written, buffers, result)
    result.lines = line0
    atomic_write_bytes(marker_path(out, task.index), json.dumps(dataclasses.asdict(result)).encode())
    return result


def count_task(task: Task, opts: TaskOptions) -> Path:
    """Vocabulary pass 1: per-feature value counts of the task's training rows, saved as .npz."""
    per_feature: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in opts.schema.sparse_names]
    line0 = 0
    for data in read_pieces(task):
        chunk = parse_chunk(data, opts.schema)
        for split, mask in _split_rows(task, line0, chunk.rows):
            if split != "train":
                continue
            rows = mask & chunk.ok
            for f in range(len(per_feature)):
                per_feature[f].append(count_values(chunk.sparse[rows, f], chunk.sparse_missing[rows, f]))
        line0 += chunk.rows
    path = marker_path(Path(opts.out), task.index, "count").with_suffix(".npz")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    arrays = {}
    for f, name in enumerate(opts.schema.sparse_names):
        arrays[f"{name}.values"], arrays[f"{name}.counts"] = merge_counts(per_feature[f])
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
    tmp.replace(path)
    return path


_VOCAB_CACHE: dict[str, list[Vocabulary]] = {}


def _load_vocabs(opts: TaskOptions) -> list[Vocabulary] | None:
    # Loaded once per worker process, not once per task.
    if not opts.vocab_path:
        return None
    if opts.vocab_path not in _VOCAB_CACHE:
        _VOCAB_CACHE[opts.vocab_path] = load_vocabularies(Path(opts.vocab_path), opts.schema.sparse_names)
    return _VOCAB_CACHE[opts.vocab_path]
