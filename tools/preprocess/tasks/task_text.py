"""A task's text: a byte range of a plain file, a range of a gzip file's text (checked against
the CRC-32 the planning pass took), a whole gzip file, or text already decoded into shared memory
(gz_stream's slots), read in pieces that end at a newline."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

from shardrec.tools.preprocess import cpu_stages
from shardrec.tools.preprocess.text.gz import (
    RAPIDGZIP_ERRORS,
    READ_ERRORS,
    crc32,
    describe_error,
    open_range,
    open_text,
)
from shardrec.tools.preprocess.text.lines import TSV_BLANK, blank_tail

PIECE_BYTES = 16 << 20  # text read at once (and parsed at once by the numpy fallback)
# Text the compiled parser takes at once: its per-row arrays (~1.5x the text) stay below the
# allocator's mmap threshold, so they are reused instead of faulted in and zeroed for every
# piece, and are still in cache when hashing and the dense transform read them.
PARSE_BYTES = 2 << 20


class InputError(ValueError):
    """An input file that cannot be read to the end (truncated gzip, I/O error)."""


@dataclass(frozen=True)
class TextRange:
    """Where a task's text is: the fields of a Task that reading it needs."""

    path: str
    start: int
    end: int
    """-1: to the end (gzip files)."""
    header: bool
    gz_index: str = ""
    crc: int = -1
    text_slot: str = ""

    @property
    def gz(self) -> bool:
        return self.path.endswith(".gz")


class Slots:
    """Shared-memory buffers for ranges' text, reused as workers finish with them."""

    def __init__(self, count: int, size: int) -> None:
        self.shm = [shared_memory.SharedMemory(create=True, size=size) for _ in range(count)]
        for s in self.shm:
            _ATTACHED[s.name] = s  # a task run in this process reads its slot without attaching

    def grow(self, slot: int, have: int) -> None:
        # A line longer than the slack: a slot twice the size, holding what was decoded.
        old = self.shm[slot]
        new = shared_memory.SharedMemory(create=True, size=2 * old.size)
        new.buf[:have] = old.buf[:have]
        self.shm[slot] = _ATTACHED[new.name] = new
        self._free(old)

    def close(self) -> None:
        for s in self.shm:
            self._free(s)

    @staticmethod
    def _free(s: shared_memory.SharedMemory) -> None:
        _ATTACHED.pop(s.name, None)
        s.unlink()
        try:
            s.close()
        except BufferError:  # a view still held (by an input error's traceback): unmapped at exit
            _UNCLOSED.append(s)


_ATTACHED: dict[str, shared_memory.SharedMemory] = {}  # slot name -> its mapping in this process
_UNCLOSED: list[shared_memory.SharedMemory] = []


def _slot_view(name: str, size: int) -> memoryview:
    if name not in _ATTACHED:
        if len(_ATTACHED) > 16:  # slots replaced by grown ones: drop the stale mappings
            for s in _ATTACHED.values():
                s.close()
            _ATTACHED.clear()
        # Attached in a spawned worker, it registers with the parent's resource tracker, which
        # already holds the name: the parent's unlink stays the only clean-up.
        _ATTACHED[name] = shared_memory.SharedMemory(name=name)
    return _ATTACHED[name].buf[:size]


def slot_pieces(task: TextRange, piece_bytes: int) -> Iterator[memoryview]:
    """The task's text from its slot in pieces ending at a newline, cut where read_pieces cuts
    the same range of a plain file (parts close on pieces: the bytes depend on the cuts)."""
    size = task.end - task.start
    view = _slot_view(task.text_slot, size + 1)  # one byte past: the producer's closing newline
    arr = np.frombuffer(view, dtype=np.uint8)
    # A last line without a newline is yielded closed, alone.
    whole = size + int(arr[size - 1] != 10)
    pos, window = 0, piece_bytes
    try:
        while pos < size:
            hi = min(pos + window, size)
            cut = hi if hi == size and arr[size - 1] == 10 else _last_newline(arr, pos, hi)
            if cut < 0:  # no newline in the window: read_pieces grows its buffer to 2x + 1
                if hi == size:
                    break
                window = 2 * window + 1
                continue
            yield view[pos:cut]
            pos = cut
        if pos < size:
            yield view[pos:whole]
    finally:
        del arr  # the mapping cannot close while a view of it is alive


def _last_newline(arr: np.ndarray, lo: int, hi: int) -> int:
    # One past the last newline in arr[lo:hi], or -1; lines are short: look back a little first.
    for start in (max(lo, hi - 4096), lo):
        nl = np.flatnonzero(arr[start:hi] == 10)
        if len(nl):
            return start + int(nl[-1]) + 1
    return -1


class TextSource:
    """The task's text as a readinto-able stream: a byte range of a plain file, a range of a gzip
    file's text (checked against the CRC-32 the planning pass took), or a whole gzip file."""

    def __init__(self, task: TextRange) -> None:
        self.task, self.left = task, (task.end - task.start) if task.end >= 0 else -1
        self.crc = 0

    def __enter__(self) -> TextSource:
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


def read_pieces(
    task: TextRange, piece_bytes: int = PIECE_BYTES, blank: bytes = TSV_BLANK
) -> Iterator[memoryview]:
    """The task's text in pieces of about `piece_bytes` that end at a newline; text read to its
    file's end (a whole .gz file) without the blank lines (of `blank` bytes: the parser's) that
    end it, as the count of its lines leaves them out (text.lines).

    Pieces are views of one reused buffer (no copies): each is valid until the next is read.
    """
    if task.text_slot:  # already decoded, in shared memory (gz_stream): read in place
        yield from slot_pieces(task, piece_bytes)
        return
    # A piece that ends in blank lines keeps them for the next, which may begin with rows after
    # them; ranges of text end where the file's last row ends (planned so).
    to_file_end = task.end < 0
    buf = bytearray(piece_bytes + 1)
    have = 0  # bytes of an unfinished line carried over from the previous read
    with TextSource(task) as src:
        while True:
            if have >= len(buf) - 1:  # a line longer than the buffer: grow it (a new one, as
                bigger = bytearray(2 * len(buf))  # views of the old may still be alive)
                bigger[:have] = buf[:have]
                buf = bigger
            with cpu_stages.stage(cpu_stages.READ):
                n = src.readinto(memoryview(buf)[have : len(buf) - 1])
                total = have + n
                cut = buf.rfind(b"\n", 0, total) + 1 if n else 0
                if cut and to_file_end:
                    cut = blank_tail(buf, 0, cut, blank)
            if n == 0:
                break
            if cut:
                yield memoryview(buf)[:cut]
                with cpu_stages.stage(cpu_stages.READ):
                    buf[: total - cut] = buf[cut:total]
            have = total - cut
    if to_file_end:
        have = blank_tail(buf, 0, have, blank)
    if have:
        closed = have + (buf[have - 1] != 10)
        buf[closed - 1] = 10  # the last line had no newline
        yield memoryview(buf)[:closed]


def parse_pieces(data: memoryview, size: int) -> Iterator[memoryview]:
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
