"""Writing one Arrow IPC file of a `FileLayout` (arrow_ipc.py), its buffers in the order the
layout places them, each written as it is produced (`Streamed`: a multi-hot copy expands a part's
ids chunk by chunk) and hashed as it is written (one pass, no read-back).

The bytes reach the file in whole `WRITE_BYTES` pieces at multiples of `WRITE_BYTES`
(`AlignedWrites`), not column by column. Linux (measured: 6.18, ext4) caches a file in folios as
large as the writes that made them: a part written in 2 MiB-aligned pieces stays in the page
cache as 2 MiB folios, which a map of the part reads through one page-table entry per 2 MiB (a
PMD) instead of one per 4 KiB. Measured on a Criteo-shaped part of 450 K rows (50.9 MB), mapped
and touched whole: 26-32 page faults and 0.2-0.4 ms once written in 4 MiB pieces; 147-161 faults
and ~1.0 ms written a column at a time (this module's writes before; unaligned pieces of the
columns' sizes). The shuffled stream maps ~256 parts anew per shuffle group (part_cache.py):
it is the stream over many parts that pays those faults, and a walk of the page cache per folio
where its warming thread asks for the next group's pages. A part read back from disk gets the
folios the kernel's read-ahead makes, whatever wrote it. A process's resident set counts a mapped
part's pages 2 MiB at a time then: over 10,000 hard-linked parts `bench loader --part-rows` reads
8.9-9.2 GB resident where it read 5.0-5.3 (file pages of the page cache, anonymous memory
unchanged)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from shardrec.dataloader.format.arrow_ipc import LIST, FileLayout

Chunks = Callable[[], Iterable[np.ndarray]]
"""A buffer written as it is produced: a function returning its pieces in order."""


@dataclass
class Streamed:
    """A buffer not held in memory: `length` values of `dtype`, in pieces from `chunks()`."""

    dtype: np.dtype
    length: int
    chunks: Chunks


Buffer = np.ndarray | Streamed

WRITE_BYTES = 4 << 20
"""Bytes per write: a multiple of the 2 MiB of an x86 or arm64 huge page (see the module's
docstring); the last write of a file takes what is left."""


class AlignedWrites:
    """Bytes given in pieces of any size, written to `f` in `WRITE_BYTES` pieces that start at
    multiples of `WRITE_BYTES` (counted from `f`'s position when this is made; a new file: 0).
    The whole `WRITE_BYTES` pieces of what is given at such a multiple go to `f` without a copy,
    the rest through one buffer. `close()` writes what is left.

    The buffer is one array of WRITE_BYTES, filled and written again: a bytearray grown by each
    piece and emptied after each write went back to the allocator and was taken again, its pages
    faulted in anew each time (measured on the columns of a 357 MB Criteo-shaped part, the file
    writes left out: 0.066 CPU-s, 0.006 now)."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self._buffer: memoryview | None = None  # made at the first piece short of a whole one
        self._held = 0  # bytes in the buffer
        try:
            self._offset = f.tell() % WRITE_BYTES  # bytes into the current WRITE_BYTES piece
        except (AttributeError, OSError):  # a stream that cannot tell: counted from here
            self._offset = 0

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            if not self._held and self._offset == 0 and len(view) >= WRITE_BYTES:
                whole = len(view) - len(view) % WRITE_BYTES
                self._f.write(view[:whole])
                view = view[whole:]
                continue
            if self._buffer is None:  # uninitialised: only the pages filled are touched
                self._buffer = memoryview(np.empty(WRITE_BYTES, np.uint8))
            take = min(len(view), WRITE_BYTES - self._offset - self._held)
            self._buffer[self._held : self._held + take] = view[:take]
            self._held += take
            view = view[take:]
            if self._offset + self._held == WRITE_BYTES:
                self._flush()
                self._offset = 0

    def _flush(self) -> None:
        # f.write consumes the bytes before it returns (io's contract): the buffer is free again
        assert self._buffer is not None
        self._f.write(self._buffer[: self._held])
        self._held = 0

    def close(self) -> None:
        if self._held:
            self._offset = (self._offset + self._held) % WRITE_BYTES
            self._flush()


def _pieces(buffer: Buffer) -> Iterator[np.ndarray]:
    if isinstance(buffer, Streamed):
        yield from buffer.chunks()
    else:
        yield buffer


def write_file(
    f: BinaryIO,
    layout: FileLayout,
    rows: int,
    data: dict[str, Buffer | tuple[Buffer, Buffer]],
) -> tuple[int, str]:
    """Write one file to the open binary file `f`, hashing as it goes; (bytes, SHA-256).

    data: column name -> its values (a `value` column: [rows]; a `block`: [rows, width] or its
    rows' values flat; a `list`: (offsets [rows + 1], values)); arrays or `Streamed` buffers.
    ValueError when a column's length disagrees with `rows` (nothing is written then)."""
    plan, lists = [], []
    for c in layout.columns:
        given = data[c.name]
        if c.kind == LIST:
            offsets, values = given
            lists.append(length(values))
            plan.append((c, [(offsets, np.dtype(np.int64), rows + 1), (values, c.dtype, None)]))
        else:
            plan.append((c, [(given, c.dtype, rows * c.width)]))
    sizes = layout.sizes(rows, lists)
    for c, bufs in plan:
        for buf, dtype, want in bufs:
            if want is not None and length(buf) != want:
                raise ValueError(f"column {c.name}: {length(buf)} values, expected {want}")
            if dtype_of(buf) != dtype:
                raise ValueError(f"column {c.name}: dtype {dtype_of(buf)}, expected {dtype}")
    head, foot = layout.image(sizes)
    h = hashlib.sha256()
    out = AlignedWrites(f)

    def put(data: bytes | memoryview) -> None:
        h.update(data)
        out.write(data)

    put(head)
    for c, bufs in plan:
        for buf, dtype, _ in bufs:
            written = 0
            for piece in _pieces(buf):
                raw = np.ascontiguousarray(piece, dtype).reshape(-1).view(np.uint8)
                if len(raw):
                    put(memoryview(raw))
                written += len(raw)
            if written != length(buf) * dtype.itemsize:
                raise ValueError(
                    f"column {c.name}: wrote {written} bytes of {length(buf) * dtype.itemsize}"
                )
            if written % 8:
                put(bytes(8 - written % 8))
    put(foot)
    out.close()
    return sizes.file, h.hexdigest()


def length(buffer: Buffer) -> int:
    """Values in a buffer (an array's size, a streamed buffer's length)."""
    return buffer.length if isinstance(buffer, Streamed) else int(np.asarray(buffer).size)


def dtype_of(buffer: Buffer) -> np.dtype:
    """A buffer's dtype."""
    return np.dtype(buffer.dtype)
