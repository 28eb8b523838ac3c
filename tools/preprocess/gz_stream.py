"""One large .gz file decoded once: the planning pass is the producer of its tasks' text.

The decoder (ISA-L through open_gzip) runs in the main process and cuts the text exactly as
chunk_bounds cuts a plain file (a range ends after the first newline at or past start +
chunk_bytes). Each range's text is decoded straight into a shared-memory slot and handed to a
worker as a task (pool.map_stream), at most one slot per worker plus two in flight; the worker
parses it in place (slot_pieces cuts the very pieces read_pieces would), so every byte is
decoded once and copied never. The workers start while the first range is decoded; a worker's
parts are fsynced and marked by the main process while it parses its next range. A pass that first
counted lines and then decoded every range again cost ~2x the decoding (gz_split.py, kept for
what cannot stream: vocabulary mode, --part).

Which split a line belongs to depends on the file's line count, known only at the end: each
task's parts are staged under .work/staged (inputs.STAGED) with a staged marker that also lists
its malformed lines; once the count is known, a task inside one split has its part directories
renamed into place, and the one or two tasks that straddle a split boundary have their staged
parts cut by row (the same bytes as parts written from the text: a part's file depends only on
its rows). On several workers the producer counts the lines, so this starts once the text is
decoded, while the workers parse the last ranges. Then the task's marker is written, so a rerun
finds finished tasks as usual; a run killed mid-stream decodes the file again and parses only
the ranges with no marker.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np

from shardrec.dataloader.format.arrow_ipc import FileLayout
from shardrec.dataloader.format.manifest import PartInfo
from shardrec.dataloader.format.part_file import map_part, write_part
from shardrec.dataloader.util.files import atomic_write_bytes, fsync_dir
from shardrec.tools.preprocess import cpu_stages
from shardrec.tools.preprocess.parse import parse_kernel
from shardrec.tools.preprocess.parse.text_parser import TextParser
from shardrec.tools.preprocess.pool import map_stream
from shardrec.tools.preprocess.tasks.task import STAGED, SplitRange, Task, TaskOptions
from shardrec.tools.preprocess.tasks.task_markers import (
    TaskResult,
    marker_path,
    read_marker,
    sync_and_mark,
    wait_for_writes,
)
from shardrec.tools.preprocess.tasks.task_run import process_setup, run_task
from shardrec.tools.preprocess.tasks.task_text import InputError, Slots
from shardrec.tools.preprocess.text import gz
from shardrec.tools.preprocess.text.gz_split import GzipScan, load_scan, save_scan
from shardrec.tools.preprocess.text.lines import blank_tail, count_newlines

logger = logging.getLogger(__name__)
_READ_AHEAD = 64 << 10  # decoded past a range's target to find its newline (lines are short)
_SLACK = 1 << 20  # room past chunk_bytes in a slot before it must grow (a line longer than this)


class _Decoder:
    """The text of one .gz file, decoded once and cut into ranges as chunk_bounds cuts plain
    text."""

    def __init__(
        self, path: Path, chunk_bytes: int, header: bool, count: bool, parser: TextParser
    ) -> None:
        """count: count each range's lines here (--strict: a worker's error names its absolute line;
        on several workers: the split boundaries are known once the text is decoded); otherwise
        its worker's parse counts them, off the producer's path. A range ends where the parser
        finds a row's end (row_end: quoted fields may hold line breaks); blank: a blank line's."""
        self.path, self.chunk, self.count, self.row_end = path, chunk_bytes, count, parser.row_end
        self.blank = parser.blank
        self.f = gz.open_gzip(path)
        self.carry, self.pos, self.eof, self.ended = b"", 0, False, False
        self.bounds: list[tuple[int, int]] = []
        self.firsts: list[int] = []  # counted: each range's first line
        self.lines = 0  # counted lines before the next range
        if header:
            self.pos = len(self._call(self.f.readline))

    def _call(self, fn: Callable, *args):
        try:
            return fn(*args)
        except gz.READ_ERRORS as e:
            raise InputError(gz.describe_error(self.path, e, self.f)) from e

    def _read(self, buf: memoryview) -> int:
        with cpu_stages.stage(cpu_stages.READ):
            n = self._call(self.f.readinto, buf) if len(buf) else 0
        self.eof = self.eof or (n == 0 and len(buf) > 0)
        return n

    def next_range(self, slots: Slots, slot: int) -> tuple[int, int] | None:
        """Decode the next range into the slot; (text start, end) or None at the end of the text."""
        have = len(self.carry)
        # The blank lines read past the last range's end (below) may be more than a slot holds.
        while have + _READ_AHEAD + 1 > len(slots.shm[slot].buf):
            slots.grow(slot, 0)
        buf = slots.shm[slot].buf
        buf[:have] = self.carry
        while have < self.chunk and not self.eof:
            have += self._read(buf[have : self.chunk])
        search, inside = (0 if self.row_end else self.chunk), False
        while True:
            end, search, inside = self._find_end(buf, search, have, inside)
            if end >= 0:
                break
            if self.eof:
                end = have
                break
            del buf  # a slot grown closes the old one once no view of it is left
            have = self._read_ahead(slots, slot, have)
            buf = slots.shm[slot].buf
        # The blank lines that end the text are none of it (text.lines): a range that ends in
        # blank lines ends before them where nothing but blank lines follows. Each byte read ahead
        # is judged once: blank lines are a run of blank bytes and newlines, so buf[end:have] is
        # when the last read is (judged all again after each read, a long run cost quadratic time).
        tail, blank = blank_tail(buf, 0, end, self.blank), end
        while tail < end and blank_tail(buf, blank, have, self.blank) == blank:
            if self.eof:
                end = tail
                break
            blank = have
            del buf  # a slot grown closes the old one once no view of it is left
            have = self._read_ahead(slots, slot, have)
            buf = slots.shm[slot].buf
        self.carry = bytes(buf[end:have])
        del buf
        if end == 0:
            self.ended = True
            return None
        return self._close(slots.shm[slot].buf, end)

    def _read_ahead(self, slots: Slots, slot: int, have: int) -> int:
        """Decode more text past `have` into the slot, grown where full; the text's new length."""
        if have + _READ_AHEAD + 1 > len(slots.shm[slot].buf):
            slots.grow(slot, have)
        return have + self._read(slots.shm[slot].buf[have : have + _READ_AHEAD])

    def _find_end(
        self, buf: memoryview, search: int, have: int, inside: bool
    ) -> tuple[int, int, bool]:
        """(one past the newline that ends the range in buf[:have], or -1; where to search on
        once more text is read; with row_end, whether a quote is open there)."""
        if self.row_end is not None:  # the first row ending at or past chunk_bytes: read lines
            return self.row_end(
                np.frombuffer(buf, np.uint8, count=have), search, self.chunk, inside
            )
        nl = bytes(buf[search:have]).find(b"\n") if have > search else -1
        return (search + nl + 1 if nl >= 0 else -1), max(search, have), False

    def _close(self, buf: memoryview, end: int) -> tuple[int, int]:
        arr = np.frombuffer(buf, dtype=np.uint8, count=end + 1)
        closed = end + int(arr[end - 1] != 10)
        arr[closed - 1] = 10  # at the end of the text: the worker parses the last line closed
        if self.count:
            self.firsts.append(self.lines)
            text = arr[:closed]
            self.lines += int(
                count_newlines(text) if parse_kernel.AVAILABLE else np.count_nonzero(text == 10)
            )
        del arr
        start = self.pos
        self.pos += end
        self.bounds.append((start, self.pos))
        return start, self.pos


def stream_gzip(
    path: Path,
    number: int,
    first_index: int,
    chunk_bytes: int,
    header: bool,
    splits: Callable[[int], tuple[SplitRange, ...]],
    opts: TaskOptions,
    workers: int,
    progress=None,
    ran: list[int] | None = None,
) -> GzipScan:
    """Decode input file `number` once, its ranges parsed by `workers` as tasks first_index, ...;
    returns its cut. splits: the file's split ranges for its line count; ran: gets the indexes of
    the tasks run. A rerun of a file whose stream finished (its cut is saved) only finalizes what
    a killed run left staged."""
    work = Path(opts.out) / ".work"
    scan = load_scan(path, number, chunk_bytes, header, work)
    if scan is None:
        stream = _Stream(path, first_index, header, splits)
        scan = _run_stream(
            stream, chunk_bytes, opts, workers, progress, ran if ran is not None else []
        )
        save_scan(path, number, chunk_bytes, header, work, scan)
    firsts = np.cumsum([0, *scan.counts[:-1]]).tolist()
    tasks = _tasks(path, first_index, header, scan.bounds, firsts, splits(scan.total_lines))
    finalize_staged(Path(opts.out), tasks, opts.part_layout().file)
    if (work / "staged").is_dir() and not any((work / "staged").iterdir()):
        (work / "staged").rmdir()
    return scan


def _tasks(
    path: Path,
    first_index: int,
    header: bool,
    bounds: list[tuple[int, int]],
    firsts: list[int],
    ranges,
) -> list[Task]:
    """The file's tasks as planned once its line count is known (ranges: its split ranges)."""
    return [
        Task(first_index + k, str(path), start, end, first, ranges, "train", header)
        for k, ((start, end), first) in enumerate(zip(bounds, firsts))
    ]


@dataclass(frozen=True)
class _Stream:
    """The file streamed: its path, its first task's index, whether it has a header, and its split
    ranges for a line count."""

    path: Path
    first_index: int
    header: bool
    splits: Callable[[int], tuple[SplitRange, ...]]


def _run_stream(
    stream: _Stream, chunk_bytes: int, opts: TaskOptions, workers: int, progress, ran: list[int]
) -> GzipScan:
    out, path, first_index, header = Path(opts.out), stream.path, stream.first_index, stream.header
    # On several workers the producer counts lines (~7 GB per CPU-second): once the text is decoded
    # the split boundaries are known, and finished tasks are placed (the one or two that straddle a
    # boundary re-cut by row) while the workers parse the last ranges, not after them.
    early = workers > 1
    decoder = _Decoder(path, chunk_bytes, header, opts.strict or early, opts.parser)
    lines: dict[int, int] = {}  # each task's lines, as its parse counted them
    placing: list[int] = []  # tasks run, not yet placed in their splits
    # Two ranges decoded ahead: when two workers finish together, both find their next range ready.
    slots = Slots(1 if workers == 1 else workers + 2, chunk_bytes + _SLACK)
    if progress:
        progress.start(path.stat().st_size, "preprocess")
    compressed = 0

    def produce(slot: int) -> Task | None:
        first = decoder.lines if opts.strict else -1
        while (cut := decoder.next_range(slots, slot)) is not None:
            index = first_index + len(decoder.bounds) - 1
            done = read_marker(out, index, "staged") or read_marker(out, index)
            if done is None:
                return Task(
                    index,
                    str(path),
                    *cut,
                    first,
                    (),
                    STAGED,
                    header,
                    text_slot=slots.shm[slot].name,
                )
            lines[index] = done.lines
            first = decoder.lines if opts.strict else -1
        return None

    try:
        with decoder.f:
            # A worker returns once its parts are written; the main process fsyncs them and writes
            # the staged marker on its sync thread while the worker parses its next range.
            run = partial(_run_counted, background_sync=not early, mark=not early)
            for task, (res, cpu) in map_stream(
                run, produce, opts, workers, len(slots.shm), process_setup
            ):
                cpu_stages.add(cpu)
                ran.append(task.index)
                lines[task.index] = res.lines
                placing.append(task.index)
                if early:
                    sync_and_mark(out, res, "staged")
                if early and decoder.ended:
                    ranges = stream.splits(decoder.lines)
                    tasks = _tasks(
                        path, first_index, header, decoder.bounds, decoder.firsts, ranges
                    )
                    wait_for_writes()  # the staged markers of the tasks placed
                    finalize_staged(
                        out, [tasks[i - first_index] for i in placing], opts.part_layout().file
                    )
                    placing.clear()
                if progress:
                    done = _compressed_position(decoder)
                    progress.advance(done - compressed, res.bytes, res.lines)
                    compressed = done
    finally:
        wait_for_writes()
        slots.close()
    counts = [lines[first_index + k] for k in range(len(decoder.bounds))]
    assert not decoder.count or sum(counts) == decoder.lines, (
        "the producer and the parsers count lines alike"
    )
    return GzipScan(decoder.bounds, counts, [-1] * len(counts), sum(counts), "")


def _run_counted(
    task: Task, opts: TaskOptions, background_sync: bool, mark: bool
) -> tuple[TaskResult, dict[str, float]]:
    """run_task, and what it cost per stage (a pool worker's own counts go back with it;
    cpu_stages)."""
    return run_task(task, opts, background_sync, mark), cpu_stages.take()


def _compressed_position(decoder: _Decoder) -> int:
    try:
        return decoder.f.fileobj.tell()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return 0


def finalize_staged(out: Path, tasks: list[Task], layout: FileLayout) -> None:
    """Move staged tasks' parts into their splits and write their markers (not staged: nothing).
    layout: the run's part file layout (a part cut in two is read and written with it)."""
    placed = []
    for task in tasks:
        staged = read_marker(out, task.index, "staged")
        if staged is not None:
            placed.append((task, _place_parts(out, task, staged, layout)))
    for split in {p["split"] for _, result in placed for p in result.parts}:
        fsync_dir(out / split)  # the parts are where they belong before a marker says so
    for task, result in placed:
        atomic_write_bytes(marker_path(out, task.index), json.dumps(asdict(result)).encode())
        marker_path(out, task.index, "staged").unlink()


def _place_parts(out: Path, task: Task, staged: TaskResult, layout: FileLayout) -> TaskResult:
    result = replace(staged, parts=[], kept={}, bad_lines=[])
    split = task.split_of(task.first_line)
    if split == task.split_of(task.first_line + staged.lines - 1):  # splits are ranges of lines
        for p in staged.parts:
            _move(out / STAGED / p["part"]["name"], out / split / p["part"]["name"])
            _record(result, split, p["part"])
        return result
    good = np.ones(staged.lines, dtype=bool)
    good[np.asarray(staged.bad_lines, dtype=np.int64)] = False
    lines = task.first_line + np.flatnonzero(good)  # the line of each kept row, in part order
    row = 0
    for p in staged.parts:
        src, rows = out / STAGED / p["part"]["name"], p["part"]["rows"]
        for split, a, b in sorted(_by_split(task, lines[row : row + rows])):
            info = PartInfo(**p["part"])
            _record(
                result, split, asdict(_write_rows(src, out / split / src.name, info, a, b, layout))
            )
        row += rows
        src.unlink()
    return result


def _by_split(task: Task, lines: np.ndarray) -> list[tuple[str, int, int]]:
    """(split, first row, end row) of each split among rows at these absolute lines (ascending)."""
    out = []
    for r in task.splits or (SplitRange(task.default_split, 0, 1 << 62),):
        a, b = np.searchsorted(lines, [r.begin, r.end])
        if b > a:
            out.append((r.split, int(a), int(b)))
    return out


def _record(result: TaskResult, split: str, part: dict) -> None:
    result.parts.append({"split": split, "part": part})
    result.kept[split] = result.kept.get(split, 0) + part["rows"]


def _move(src: Path, dest: Path) -> None:
    if not src.is_file() and dest.is_file():
        return  # moved by a run killed before it wrote the marker
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(src, dest)


def _write_rows(
    src: Path, dest: Path, info: PartInfo, a: int, b: int, layout: FileLayout
) -> PartInfo:
    """Rows [a, b) of a staged part written as a part of their own (write_part: the same bytes)."""
    part = map_part(str(src), info, layout)
    sparse, offsets = {}, {}
    for name, ids in part.sparse.items():
        off = part.offsets.get(name)
        if off is None:
            sparse[name] = ids[a:b]
        else:
            offsets[name] = off[a : b + 1] - off[a]
            sparse[name] = ids[off[a] : off[b]]
    return write_part(dest, layout, part.labels[a:b], part.dense[a:b], sparse, offsets)
