"""The Arrow IPC file format (Feather v2), laid out byte for byte here (its flatbuffers in
flatbuffer.py; a file written, buffers streamed and hashed, by arrow_ipc_write.py), for the three
kinds of column a part holds; read back by checking the bytes against what would have been written.

Why not pyarrow's writer: a column must be written as it is produced (a multi-hot copy expands a
part's ids chunk by chunk; its whole columns would be hundreds of MB per worker), hashed while it
is written (one pass, no read-back), and the bytes must depend on shardrec alone, so that the same
rows give the same files, hence the same checksums and dataset fingerprints, whatever pyarrow is
installed (pyarrow 15 and 26 order the schema's flatbuffer differently). Why not pyarrow's reader:
the loader opens thousands of parts a shuffle group, and a file whose metadata is the one image
shardrec writes for its row and list lengths needs no parser: its buffers lie where the layout
says, which a hostile file cannot move (see `FileLayout.check`). pyarrow, polars and duckdb read
the files as any Arrow IPC file (the tests read every kind with pyarrow and polars).

The file (Arrow's IPC file format, one record batch, no compression, little-endian)::

    "ARROW1\\0\\0"
    schema message:        0xFFFFFFFF, int32 size, Message{Schema} flatbuffer (padded to 8)
    record batch message:  0xFFFFFFFF, int32 size, Message{RecordBatch} flatbuffer (padded to 8)
    body:                  every buffer in column order, each padded to 8 bytes with zeros
    end of stream:         0xFFFFFFFF, 0x00000000
    footer:                Footer flatbuffer (the schema again, the batch's Block)
    int32 footer size, "ARROW1"

Columns (`Column.kind`), their Arrow types and buffers in file order:

- `value`: one value per row, a primitive array (`uint8` ... `uint64`, `int8` ... `int64`,
  `float16/32/64`): validity (empty), values [rows].
- `block`: `width` values per row, `fixed_size_list<item: T not null>[width]`: validity (empty),
  the child's validity (empty), values [rows, width] in row-major order (numpy's C order).
- `list`: any number of values per row, `large_list<item: T not null>`: validity (empty), int64
  offsets [rows + 1] (row r is values[offsets[r]:offsets[r + 1]], offsets[0] = 0), the child's
  validity (empty), values [offsets[rows]].

No nulls anywhere (every field is `not null`, validity buffers are empty). The schema carries one
custom metadata entry (key and value given by the caller). Buffers are 8-byte aligned in the file
(the IPC minimum, what pyarrow writes: numpy views of a map are aligned for every dtype here).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardrec.dataloader.format.flatbuffer import Image, Table, Var, Vector

VALUE, BLOCK, LIST = "value", "block", "list"
KINDS = (VALUE, BLOCK, LIST)
MAGIC = b"ARROW1"
CONTINUATION = b"\xff\xff\xff\xff"
END_OF_STREAM = CONTINUATION + b"\x00\x00\x00\x00"
_TAIL = 4 + len(MAGIC)  # int32 footer size, magic
_V5 = 4  # MetadataVersion.V5
_HEADER_SCHEMA, _HEADER_RECORD_BATCH = 1, 3  # MessageHeader union
_TYPE_INT, _TYPE_FLOAT, _TYPE_FIXED_SIZE_LIST, _TYPE_LARGE_LIST = 2, 3, 16, 21  # Type union
_PRECISION = {2: 0, 4: 1, 8: 2}  # FloatingPoint precision by itemsize: HALF, SINGLE, DOUBLE
EXPECTED_KEPT = 64
"""(rows, list lengths) whose expected bytes a layout keeps at most (`FileLayout.expected`)."""


def _pad8(n: int) -> int:
    return (n + 7) & ~7


@dataclass(frozen=True)
class Column:
    """One column of a part file: its name, the dtype of its values and its kind (module doc)."""

    name: str
    dtype: np.dtype
    kind: str = VALUE
    width: int = 1
    """`block` only: values per row."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        if self.kind not in KINDS:
            raise ValueError(f"column {self.name}: kind {self.kind!r}, expected one of {KINDS}")
        if self.dtype.kind not in "uif" or self.dtype.byteorder == ">":
            raise ValueError(
                f"column {self.name}: dtype {self.dtype} is not a little-endian number"
            )
        if self.kind == BLOCK and self.width < 1:
            raise ValueError(f"column {self.name}: a block needs a width >= 1, got {self.width}")

    @property
    def buffers(self) -> int:
        return {VALUE: 2, BLOCK: 3, LIST: 4}[self.kind]


# -- Arrow's messages, as flatbuffers (flatbuffer.py) -------------------------------------------


def _type(column: Column) -> tuple[int, Table]:
    d = column.dtype
    if d.kind == "f":
        return _TYPE_FLOAT, Table({0: ("h", _PRECISION[d.itemsize])})
    return _TYPE_INT, Table({0: ("i", 8 * d.itemsize), 1: ("B", int(d.kind == "i"))})


def _field(name: str, type_id: int, type_table: Table, children: list[Table]) -> Table:
    # name, nullable (false), type_type, type, children; no dictionary, no custom metadata
    return Table(
        {
            0: ("o", name.encode()),
            1: ("B", 0),
            2: ("B", type_id),
            3: ("o", type_table),
            5: ("o", Vector(children)),
        }
    )


def _column_field(column: Column) -> Table:
    type_id, table = _type(column)
    if column.kind == VALUE:
        return _field(column.name, type_id, table, [])
    item = _field("item", type_id, table, [])
    if column.kind == BLOCK:
        return _field(column.name, _TYPE_FIXED_SIZE_LIST, Table({0: ("i", column.width)}), [item])
    return _field(column.name, _TYPE_LARGE_LIST, Table(), [item])


def _schema(columns: Sequence[Column], key: str, value: str) -> Table:
    meta = Table({0: ("o", key.encode()), 1: ("o", value.encode())})
    # endianness (little: the default), fields, custom_metadata
    return Table(
        {
            0: ("h", 0),
            1: ("o", Vector([_column_field(c) for c in columns])),
            2: ("o", Vector([meta])),
        }
    )


def _message(header_type: int, header: Table, body: int | Var) -> tuple[bytes, dict[str, int]]:
    image = Image()
    fb = image.root(Table({0: ("h", _V5), 1: ("B", header_type), 2: ("o", header), 3: ("q", body)}))
    return fb, image.marks


# -- the layout of one schema -----------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    """Where one file's buffers lie, from its row count and list lengths."""

    rows: int
    list_lengths: tuple[int, ...]
    buffers: list[tuple[int, int]]
    """(offset from the body's start, length) of every buffer, in file order."""
    body: int
    file: int


class FileLayout:
    """The byte image of a part file for one set of columns and one schema metadata entry: the
    same for every part of a dataset but for the per-file values (rows, list lengths, the buffers'
    places), which `image` fills in."""

    def __init__(self, columns: Sequence[Column], key: str, value: str) -> None:
        self.columns = tuple(columns)
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise ValueError(f"column names repeat: {names}")
        self.key, self.value = key, value
        schema_fb, _ = _message(_HEADER_SCHEMA, _schema(self.columns, key, value), 0)
        self.lists = [i for i, c in enumerate(self.columns) if c.kind == LIST]
        nodes = sum(1 if c.kind == VALUE else 2 for c in self.columns)
        buffers = sum(c.buffers for c in self.columns)
        batch = Table(
            {
                0: ("q", Var("rows")),
                1: ("o", Vector([(0, 0)] * nodes, "qq", mark="nodes")),
                2: ("o", Vector([(0, 0)] * buffers, "qq", mark="buffers")),
            }
        )
        batch_fb, marks = _message(_HEADER_RECORD_BATCH, batch, Var("body"))
        schema_at = 8
        batch_at = schema_at + 8 + len(schema_fb)
        self.batch_at = batch_at
        """Where the record batch message starts: the bytes before it depend on the columns only."""
        self.body_at = batch_at + 8 + len(batch_fb)
        self.head = (
            MAGIC + b"\0\0"
            + CONTINUATION + struct.pack("<i", len(schema_fb)) + schema_fb
            + CONTINUATION + struct.pack("<i", len(batch_fb)) + batch_fb
        )  # fmt: skip
        self.marks = {k: batch_at + 8 + v for k, v in marks.items()}
        footer = Image()
        footer_fb = footer.root(
            Table(
                {
                    0: ("h", _V5),
                    1: ("o", _schema(self.columns, key, value)),
                    2: ("o", Vector([], "qi4xq")),
                    3: ("o", Vector([(batch_at, 8 + len(batch_fb), 0)], "qi4xq", mark="block")),
                }
            )
        )
        self.foot = END_OF_STREAM + footer_fb + struct.pack("<i", len(footer_fb)) + MAGIC
        self.foot_body_at = len(END_OF_STREAM) + footer.marks["block"] + 16  # Block.bodyLength
        # The factors of each buffer's length: (bytes per row, bytes per list value, list, fixed).
        per_row, per_value, of_list, fixed = [], [], [], []
        for i, c in enumerate(self.columns):
            size = c.dtype.itemsize
            if c.kind == VALUE:
                rows = [0, size]
            elif c.kind == BLOCK:
                rows = [0, 0, size * c.width]
            else:
                rows = [0, 8, 0, 0]
            for k, r in enumerate(rows):
                per_row.append(r)
                value_bytes = c.kind == LIST and k == 3
                per_value.append(size if value_bytes else 0)
                of_list.append(self.lists.index(i) if value_bytes else -1)
                fixed.append(8 if c.kind == LIST and k == 1 else 0)  # offsets: rows + 1
        # Python ints, not arrays: a part is opened in tens of microseconds, numpy's calls on
        # arrays this small cost more than a loop.
        self._factors = list(zip(per_row, per_value, of_list, fixed))
        # Per column, the index of its values buffer and (lists) of its offsets buffer.
        self.values_buffer, self.offsets_buffer, k = [], [], 0
        for c in self.columns:
            self.values_buffer.append(k + c.buffers - 1)
            self.offsets_buffer.append(k + 1 if c.kind == LIST else -1)
            k += c.buffers
        self._node_rows = []  # per node: (rows factor, -1) or (0, list index)
        for i, c in enumerate(self.columns):
            self._node_rows.append((1, -1))
            if c.kind == BLOCK:
                self._node_rows.append((c.width, -1))
            elif c.kind == LIST:
                self._node_rows.append((0, self.lists.index(i)))
        self._expected: dict[tuple[int, tuple[int, ...]], tuple[Sizes, bytes, bytes]] = {}

    def sizes(self, rows: int, list_lengths: Sequence[int] = ()) -> Sizes:
        """The buffers' places for a file of `rows` rows and these list lengths (values per list
        column, in column order)."""
        lists = tuple(int(n) for n in list_lengths)
        if len(lists) != len(self.lists):
            raise ValueError(f"{len(lists)} list lengths for {len(self.lists)} list columns")
        buffers, at = [], 0
        for per_row, per_value, of_list, fixed in self._factors:
            length = per_row * rows + fixed + (per_value * lists[of_list] if of_list >= 0 else 0)
            buffers.append((at, length))
            at += (length + 7) & ~7
        return Sizes(rows, lists, buffers, at, self.body_at + at + len(self.foot))

    def image(self, sizes: Sizes) -> tuple[bytes, bytes]:
        """The file's bytes before its body and after it."""
        head = bytearray(self.head)
        struct.pack_into("<q", head, self.marks["rows"], sizes.rows)
        struct.pack_into("<q", head, self.marks["body"], sizes.body)
        nodes = []
        for factor, lst in self._node_rows:
            nodes += (sizes.rows * factor if lst < 0 else sizes.list_lengths[lst], 0)
        struct.pack_into(f"<{len(nodes)}q", head, self.marks["nodes"], *nodes)
        flat = [v for pair in sizes.buffers for v in pair]
        struct.pack_into(f"<{len(flat)}q", head, self.marks["buffers"], *flat)
        foot = bytearray(self.foot)
        struct.pack_into("<q", foot, self.foot_body_at, sizes.body)
        return bytes(head), bytes(foot)

    def expected(self, rows: int, lists: tuple[int, ...]) -> tuple[Sizes, bytes, bytes]:
        """`sizes(rows, lists)` and its `image`, kept for up to EXPECTED_KEPT (rows, lists):
        the parts of a dataset share a few (every full part one; a day's last part its own), and
        making the image was ~40% of a part's opening, which a 10,000-part stream does ~250 times
        a shuffle group."""
        key = (rows, lists)
        known = self._expected.get(key)
        if known is None:
            sizes = self.sizes(rows, lists)
            known = (sizes, *self.image(sizes))
            if len(self._expected) >= EXPECTED_KEPT:  # lists of every length: start again
                self._expected.clear()
            self._expected[key] = known
        return known

    def lengths_in(self, head: bytes) -> tuple[int, tuple[int, ...]]:
        """(rows, list lengths) as a file's head states them (trusted only once `check` passed)."""
        rows = struct.unpack_from("<q", head, self.marks["rows"])[0]
        nodes = struct.unpack_from(f"<{2 * len(self._node_rows)}q", head, self.marks["nodes"])
        lists = [nodes[2 * k] for k, (_, lst) in enumerate(self._node_rows) if lst >= 0]
        return rows, tuple(lists)

    def check(self, head: bytes, foot: bytes, file_size: int) -> Sizes | str:
        """The file's places if its head and foot are exactly what this layout writes for the
        lengths they state, and its size theirs; else why not (one phrase)."""
        if len(head) < len(self.head) or len(foot) < len(self.foot) or file_size < len(self.head):
            return f"{file_size} bytes, too short for a part of these columns"
        if head[: self.batch_at] != self.head[: self.batch_at]:
            return "its columns (names, types) or their metadata are not the manifest's"
        rows, lists = self.lengths_in(head)
        if rows < 0 or any(n < 0 for n in lists) or max(rows, *lists, 0) > file_size:
            return f"its metadata states {rows} rows and list lengths {list(lists)}, impossible for its size"
        sizes, want_head, want_foot = self.expected(rows, lists)
        if head != want_head:
            return (
                f"its buffers are not where shardrec writes them for {rows} rows and list "
                f"lengths {list(lists)} (a moved or resized buffer)"
            )
        if foot != want_foot:
            return (
                "its footer is not the one shardrec writes for its columns (truncated or changed?)"
            )
        if file_size != sizes.file:
            return f"{file_size} bytes, its metadata says {sizes.file}"
        return sizes
