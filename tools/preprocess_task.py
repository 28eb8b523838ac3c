"""One preprocessing task: read a byte range (or a gzip file), parse, map ids, write parts.

A task writes its parts, then a marker file (`.work/task-NNNNN.json`) recording what it
wrote; both go to temporary names first and are renamed. A rerun skips every task whose
marker exists, so a run killed at any point redoes only unfinished tasks.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from shardrec.dataloader.format import atomic_write_bytes, smallest_uint, write_part
from shardrec.tools.criteo_parse import REASONS, Schema, describe_bad_row, parse_chunk, transform_dense
from shardrec.tools.preprocess_ids import Vocabulary, count_values, hash_ids, load_vocabularies, merge_counts
from shardrec.tools.preprocess_plan import Task, count_range_lines, header_end, open_text

MAX_REPORTED = 5
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


def read_pieces(task: Task, chunk_bytes: int) -> Iterator[bytes]:
    """The task's text in pieces that end at a newline (one piece for a plain byte range)."""
    if not task.gz:
        with open(task.path, "rb") as f:
            f.seek(task.start)
            data = f.read(task.end - task.start)
        yield data if not data or data.endswith(b"\n") else data + b"\n"
        return
    rest = b""
    try:
        with open_text(task.path) as f:
            if task.header:
                f.readline()
            while block := f.read(chunk_bytes):
                block = rest + block
                cut = block.rfind(b"\n") + 1
                rest = block[cut:]
                if cut:
                    yield block[:cut]
    except (EOFError, OSError, zlib.error) as e:
        raise InputError(f"{task.path}: unreadable or truncated: {e}") from e
    if rest:
        yield rest + b"\n"


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
    out = {}
    for f, name in enumerate(opts.schema.sparse_names):
        card = opts.cardinalities[f]
        values, missing = chunk.sparse[:, f], chunk.sparse_missing[:, f]
        ids = vocabs[f].lookup(values, missing) if vocabs else hash_ids(values, missing, card)
        out[name] = ids.astype(smallest_uint(card - 1))
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


def run_task(task: Task, opts: TaskOptions) -> TaskResult:
    """Parse and write one task; writes its marker last. Returns what the marker holds."""
    out = Path(opts.out)
    vocabs = _load_vocabs(opts)
    result = TaskResult(task.index, task.path)
    line0 = 0
    for piece_no, data in enumerate(read_pieces(task, opts.chunk_bytes)):
        chunk = parse_chunk(data, opts.schema)
        _note_bad_rows(task, data, chunk, line0, result, opts)
        dense = transform_dense(chunk.dense, chunk.dense_missing, opts.dense_transform, opts.dense_dtype)
        ids = map_ids(chunk, opts, vocabs)
        for split, mask in _split_rows(task, line0, chunk.rows):
            rows = mask & chunk.ok
            if not rows.any():
                continue
            part_dir = out / split / f"part-{task.index:05d}-{piece_no:04d}"
            info = write_part(part_dir, chunk.labels[rows], dense[rows], {k: v[rows] for k, v in ids.items()})
            result.parts.append({"split": split, "part": dataclasses.asdict(info)})
            result.kept[split] = result.kept.get(split, 0) + info.rows
        line0 += chunk.rows
        result.bytes += len(data)
    result.lines = line0
    atomic_write_bytes(marker_path(out, task.index), json.dumps(dataclasses.asdict(result)).encode())
    return result


def count_task(task: Task, opts: TaskOptions) -> Path:
    """Vocabulary pass 1: per-feature value counts of the task's training rows, saved as .npz."""
    per_feature: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in opts.schema.sparse_names]
    line0 = 0
    for data in read_pieces(task, opts.chunk_bytes):
        chunk = parse_chunk(data, opts.schema)
        for split, mask in _split_rows(task, line0, chunk.rows):
            if split != "train":
                continue
            rows = mask & chunk.ok
            for f in range(len(per_feature)):
                per_feature[f].append(count_values(chunk.sparse[rows, f], chunk.sparse_missing[rows, f]))
        line0 += chunk.rows
    path = marker_path(Path(opts.out), task.index, "count").with_suffix(".npz")
    tmp = path.with_name(f".{path.name}.tmp")
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
