"""Writing one Arrow IPC file of a `FileLayout` (arrow_ipc.py), its buffers in the order the
layout places them, each written as it is produced (`Streamed`: a multi-hot copy expands a part's
ids chunk by chunk) and hashed as it is written (one pass, no read-back)."""

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

    def put(data: bytes | memoryview) -> None:
        h.update(data)
        f.write(data)

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
    return sizes.file, h.hexdigest()


def length(buffer: Buffer) -> int:
    """Values in a buffer (an array's size, a streamed buffer's length)."""
    return buffer.length if isinstance(buffer, Streamed) else int(np.asarray(buffer).size)


def dtype_of(buffer: Buffer) -> np.dtype:
    """A buffer's dtype."""
    return np.dtype(buffer.dtype)
