"""Flatbuffers written forward, as the Arrow IPC file's messages and footer need them
(arrow_ipc.py): tables, vectors and strings laid out into one image, with the places of the
per-file values (`Var`) recorded to be filled in later.

Flatbuffers are laid out forward (a table's vtable just before it, every child after the field
that points to it: flatbuffers' offsets only point forward), each scalar aligned to its size from
the start of its flatbuffer, which starts 8-aligned in the file.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field


class Var:
    """An int64 whose value differs per file (a row count, a buffer's place): written as 0 in the
    template, its position recorded under `name`."""

    def __init__(self, name: str) -> None:
        self.name = name


@dataclass
class Table:
    # slot -> (struct format, value): "b"/"B"/"h"/"i"/"q" scalars (value int or Var), "o" offset
    # (value a Table, Vector or bytes: a string)
    fields: dict[int, tuple[str, object]] = field(default_factory=dict)


@dataclass
class Vector:
    items: list  # "o": Table/bytes each; a struct format: tuples of values
    fmt: str = "o"
    mark: str = ""
    """A struct vector whose items are all per-file values: its elements' position is recorded
    under this name (they are filled as one block)."""


_SIZE = {"b": 1, "B": 1, "h": 2, "i": 4, "q": 8, "o": 4}


class Image:
    """One flatbuffer being laid out: bytes, and where the per-file values go."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.marks: dict[str, int] = {}

    def align(self, boundary: int, then: int = 0) -> None:
        """Pad so that the next byte written is `then` past a multiple of `boundary`."""
        while (len(self.out) - then) % boundary:
            self.out.append(0)

    def root(self, table: Table) -> bytes:
        self.out += b"\0\0\0\0"
        self._patch(0, self.table(table))
        self.align(8)
        return bytes(self.out)

    def _patch(self, at: int, target: int) -> None:
        struct.pack_into("<I", self.out, at, target - at)

    def table(self, t: Table) -> int:
        # Inline layout: the soffset to the vtable, then fields by size, largest first, each
        # aligned to its size (the table starts 8-aligned).
        slots = sorted(t.fields, key=lambda s: (-_SIZE[t.fields[s][0]], s))
        where, at = {}, 4
        for s in slots:
            size = _SIZE[t.fields[s][0]]
            at = (at + size - 1) // size * size
            where[s] = at
            at += size
        inline = at
        count = max(t.fields) + 1 if t.fields else 0
        vtable = struct.pack(
            f"<HH{count}H", 4 + 2 * count, inline, *(where.get(s, 0) for s in range(count))
        )
        self.align(2)
        vt_at = len(self.out)
        self.out += vtable
        self.align(8)
        start = len(self.out)
        self.out += bytes(inline)
        struct.pack_into("<i", self.out, start, start - vt_at)
        children = []
        for s in slots:
            fmt, value = t.fields[s]
            if fmt == "o":
                children.append((start + where[s], value))
            elif isinstance(value, Var):
                self.marks[value.name] = start + where[s]
            else:
                struct.pack_into("<" + fmt, self.out, start + where[s], value)
        for at, child in children:
            self._patch(at, self.child(child))
        return start

    def child(self, value: object) -> int:
        if isinstance(value, Table):
            return self.table(value)
        if isinstance(value, bytes):  # a string: length, bytes, NUL
            self.align(4)
            at = len(self.out)
            self.out += struct.pack("<I", len(value)) + value + b"\0"
            return at
        assert isinstance(value, Vector)
        if value.fmt == "o":
            self.align(4)
            at = len(self.out)
            self.out += struct.pack("<I", len(value.items)) + bytes(4 * len(value.items))
            for k, item in enumerate(value.items):
                self._patch(at + 4 + 4 * k, self.child(item))
            return at
        self.align(8, then=4)  # elements of 8-byte structs start 8-aligned
        at = len(self.out)
        self.out += struct.pack("<I", len(value.items))
        if value.mark:
            self.marks[value.mark] = len(self.out)
        for item in value.items:
            self.out += struct.pack(
                "<" + value.fmt, *(0 if isinstance(v, Var) else v for v in item)
            )
        return at
