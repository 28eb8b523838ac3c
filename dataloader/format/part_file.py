"""One part of a dataset: one Arrow IPC file (Feather v2) that any Arrow reader opens as it is.

    DIR/<split>/part-00000.arrow

Its columns, in this order, one row per sample (arrow_ipc.py has the byte layout of each kind):

- `label` (value): `uint8`, labels [rows].
- `dense` (block): `fixed_size_list<item: float not null>[D]` (`halffloat` for float16), the
  dense values [rows, D] row-major; omitted when the dataset has no dense feature (D = 0).
- each one-hot feature (value): the smallest unsigned integer that holds its table's rows, one
  id per row (`uint64` raw ids for a feature kept raw: format.raw_ids).
- each list feature (list): `large_list<item: uintN not null>`, int64 offsets [rows + 1] and
  the ids back to back.

Features come in the manifest's order; nothing is nullable (a missing value has already become id
0 or dense 0). The schema's metadata holds one entry, `shardrec`: sorted JSON naming the format
and schema version, the dense features and each feature's table rows and pooling, so that a file
says what its columns are on its own.

The columns are generic (arrow_ipc.Column: a value per row, a fixed-width block per row, a list
per row, of any numeric dtype), so that other kinds of part (raw 64-bit ids, per-user event
sequences) are other column lists of the same three kinds, written and checked by the same code.

Opening a part (`open_part`) is cheap and strict: one lstat, one open, two preads (the file's
metadata, before any of it is mapped) checked to be exactly the bytes shardrec writes for the
manifest's columns and the rows and list lengths they state, the ends of each list's offsets, then
one map of the whole file (its descriptor closed at once) whose buffers become numpy views; no
column byte is read. A file of another size, layout or row count than the manifest says is one
DatasetError naming the file. What opening cannot see (a changed data byte) is caught by the ids'
bounds checks as they are read and by `data verify` (the manifest's SHA-256 of each file).
"""

from __future__ import annotations

import functools
import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from shardrec.dataloader.format import arrow_ipc
from shardrec.dataloader.format.arrow_ipc import BLOCK, LIST, VALUE, Column, FileLayout
from shardrec.dataloader.format.arrow_ipc_write import Streamed, length, write_file
from shardrec.dataloader.format.dataset_files import inside_dataset
from shardrec.dataloader.format.manifest import (
    MANIFEST,
    SCHEMA_VERSION,
    DatasetError,
    Manifest,
    PartInfo,
    SparseFeature,
    shown,
)
from shardrec.dataloader.util.files import atomic_open
from shardrec.dataloader.util.mapping import limit_message, map_open_file

METADATA_KEY = "shardrec"
PART_FORMAT = "shardrec-part"
LABEL, DENSE = "label", "dense"
RESERVED = (LABEL, DENSE)
"""Column names a feature cannot take."""


@dataclass
class Part:
    """One part's columns, memory-mapped: nothing is read until it is indexed."""

    path: Path
    rows: int
    labels: np.ndarray
    dense: np.ndarray
    sparse: dict[str, np.ndarray]
    offsets: dict[str, np.ndarray]
    limits: dict[str, int] = field(default_factory=dict)
    """Feature name -> table rows: every id of the feature must be below it (the loader checks
    the ids it reads; empty where the layout gives no bound)."""
    addresses: dict[str, int] = field(default_factory=dict)
    """Column name (LABEL, DENSE, a feature) -> the data address of its values, where the part's
    opening knew it (`column_address`)."""
    offset_addresses: dict[str, int] = field(default_factory=dict)
    """List feature name -> the data address of its offsets, likewise."""
    read_spans: tuple[tuple[int, int, int], ...] = ()
    """Per column a shuffle group reads rows of ahead (format/part_cache.py; a list feature: its
    offsets), (offset from `map_address`, bytes a row, rows beyond the last read), where the
    opening knew them (shared by the parts of one shape); else they come from the arrays."""
    map_address: int = 0
    """Where the file's map starts (with `read_spans`)."""
    residency_known: bool = False
    """Whether mincore tells this process which of the file's pages are cached: since Linux 5.0
    it does only for the file's owner or a process that may write it, and says "all cached" to
    anyone else (mapping.read_ahead_spans)."""

    def column_address(self, name: str, array: np.ndarray, offsets: bool = False) -> int:
        """The data address of `array`, the part's column `name` (its offsets if `offsets`):
        ~1.5 us through numpy's ctypes for each array, where the opening did not record it (a
        10,000-part stream opens ~256 parts of ~28 columns per shuffle group, and its gathers and
        read-ahead want them all)."""
        address = (self.offset_addresses if offsets else self.addresses).get(name)
        return array.ctypes.data if address is None else address

    def plain(self) -> Part:
        """The part with plain ndarray views of its maps: np.memmap results pay subclass
        bookkeeping on every indexing (the same memory, so the addresses hold)."""
        return replace(
            self,
            labels=np.asarray(self.labels),
            dense=np.asarray(self.dense),
            sparse={k: np.asarray(v) for k, v in self.sparse.items()},
            offsets={k: np.asarray(v) for k, v in self.offsets.items()},
        )


def _id_dtype(feature: SparseFeature) -> np.dtype:
    """A feature's id dtype, which must be unsigned (ids are row numbers)."""
    try:
        dtype = np.dtype(feature.dtype)
    except TypeError:
        dtype = None
    if dtype is None or dtype.kind != "u":
        raise DatasetError(
            f"feature {feature.name} has dtype {shown(feature.dtype)}, expected an unsigned integer type"
        )
    return dtype


@functools.lru_cache(maxsize=32)
def _layout(dense: tuple[str, ...], dense_dtype: str, features: tuple[tuple, ...]) -> FileLayout:
    columns = [Column(LABEL, np.uint8)]
    if dense:
        columns.append(Column(DENSE, np.dtype(dense_dtype), BLOCK, len(dense)))
    for name, dtype, multi_hot, _, _, _ in features:
        if name in RESERVED:
            raise DatasetError(f"feature {name!r}: the name of a part's {name} column; rename it")
        columns.append(Column(name, dtype, LIST if multi_hot else VALUE))
    metadata = {
        "format": PART_FORMAT,
        "schema_version": SCHEMA_VERSION,
        "dense": list(dense),
        "features": {name: {"table_rows": card, "pooling": pooling, "list": multi_hot}
                     | ({"ids": ids} if ids else {})
                     for name, _, multi_hot, card, pooling, ids in features},
    }  # fmt: skip
    return FileLayout(columns, METADATA_KEY, json.dumps(metadata, sort_keys=True))


def file_layout(
    dense_features: Sequence[str], dense_dtype: str, features: Sequence[SparseFeature]
) -> FileLayout:
    """The file layout of a dataset's parts: its dense features, their dtype and its features
    (names, id dtypes, lists or not, table rows and pooling)."""
    try:
        dense = np.dtype(dense_dtype)
    except TypeError:
        dense = None
    if dense is None or dense.kind != "f":
        raise DatasetError(f"dense dtype {shown(dense_dtype)} is not a float type")
    key = tuple(
        (f.name, _id_dtype(f).str, bool(f.multi_hot), int(f.cardinality), f.pooling, f.ids)
        for f in features
    )
    return _layout(tuple(dense_features), dense.str, key)


def manifest_layout(manifest: Manifest, directory: Path | None = None) -> FileLayout:
    """The file layout of `manifest`'s parts (a DatasetError names DIR/manifest.json)."""
    try:
        return file_layout(manifest.dense_features, manifest.dense_dtype, manifest.sparse_features)
    except DatasetError as e:
        raise DatasetError(f"{Path(directory or '.') / MANIFEST}: {e}") from None


def write_part(
    path: Path,
    layout: FileLayout,
    labels: np.ndarray,
    dense: np.ndarray | Streamed,
    sparse: dict[str, np.ndarray | Streamed],
    offsets: dict[str, np.ndarray | Streamed] | None = None,
    *,
    fsync: bool = True,
) -> PartInfo:
    """Write one part file (a temporary name, then renamed), hashing it as it is written; returns
    what the manifest records of it.

    Args:
        path: DIR/<split>/<name>.arrow.
        labels: [rows] 0/1 labels.
        dense: [rows, num_dense] transformed dense values.
        sparse: feature name -> ids (one per row, or back to back for list features).
        offsets: feature name -> int64 [rows + 1] row offsets, for list features only.
        fsync: flush the file to disk before renaming it. A caller that records the part as
            finished later (preprocess's task marker) may pass False and fsync it itself before
            that record, off its critical path.
    """
    rows = len(labels)
    offsets = offsets or {}
    names = [c.name for c in layout.columns if c.name not in RESERVED]
    if sorted(sparse) != sorted(names) or sorted(offsets) != sorted(
        c.name for c in layout.columns if c.kind == LIST
    ):
        raise ValueError(
            f"{path}: features {sorted(sparse)} (lists {sorted(offsets)}) are not the layout's "
            f"{names}"
        )
    data: dict = {LABEL: np.asarray(labels).astype(np.uint8, copy=False)}
    for c in layout.columns[1:]:
        if c.name == DENSE:
            data[DENSE] = dense
            if not isinstance(dense, Streamed) and dense.shape[0] != rows:
                raise ValueError(f"dense has {dense.shape[0]} rows, labels {rows}")
        elif c.kind == LIST:
            off = offsets[c.name]
            off = off if isinstance(off, Streamed) else np.asarray(off).astype(np.int64, copy=False)
            ids = sparse[c.name]
            if not isinstance(off, Streamed) and (
                len(off) != rows + 1 or int(off[0]) != 0 or int(off[-1]) != length(ids)
            ):
                raise ValueError(
                    f"{c.name}: offsets do not match {rows} rows and {length(ids)} ids"
                )
            data[c.name] = (off, ids)
        else:
            if length(sparse[c.name]) != rows:
                raise ValueError(
                    f"{c.name}: {length(sparse[c.name])} ids for {rows} rows (one-hot "
                    "features hold one id per row)"
                )
            data[c.name] = sparse[c.name]
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, fsync=fsync) as f:
        size, sha256 = write_file(f, layout, rows, data)
    return PartInfo(name=path.name, rows=rows, bytes=size, sha256=sha256)


class ChangedFileError(DatasetError):
    """A dataset file whose size, layout or rows are no longer what the manifest says. `problem`
    says what differs; the message adds what to do where the dataset's folder is known (not in
    `data verify`'s own report, which says how to repair)."""

    def __init__(self, problem: str, directory: Path | None = None) -> None:
        advice = (
            f"; `shardrec data verify {directory}` names every changed file and how to write it "
            "again (or restore the file from a copy)"
        )
        super().__init__(problem + (advice if directory is not None else ""))
        self.problem = problem


def check_part_file(directory: Path, split: str, info: PartInfo) -> None:
    """Cheap check of a part without opening it: its file exists inside the dataset directory with
    the manifest's size (one lstat for a regular file in a plain folder)."""
    path = f"{directory}{os.sep}{split}{os.sep}{info.name}"
    try:
        st = os.lstat(path)
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode) or os.path.islink(os.path.dirname(path)):
        # a symlink (the file, or its split's folder): followed only inside the dataset
        st = os.stat(path) if os.path.isfile(path) else None
        if st is not None:
            inside_dataset(directory, Path(path))
    if st is None or not stat.S_ISREG(st.st_mode):
        raise DatasetError(f"{path}: missing (named by {directory / MANIFEST})")
    if st.st_size != info.bytes:
        raise ChangedFileError(
            f"{path}: {st.st_size} bytes on disk, manifest says {info.bytes} (truncated or "
            "replaced?)",
            directory,
        )


def open_part(
    directory: Path,
    split: str,
    info: PartInfo,
    manifest: Manifest,
    layout: FileLayout | None = None,
) -> Part:
    """Memory-map one part after checking it (module doc): DatasetError names the file and what
    differs. The ids are not read here: the loader checks those it reads against `Part.limits`."""
    layout = layout or manifest_layout(manifest, directory)
    check_part_file(directory, split, info)
    limits = {f.name: int(f.cardinality) for f in manifest.sparse_features}
    path = f"{directory}{os.sep}{split}{os.sep}{info.name}"
    try:
        return map_part(path, info, layout, limits, manifest.dense_dtype)
    except ChangedFileError as e:
        raise ChangedFileError(e.problem, directory) from None


def map_part(
    path: str,
    info: PartInfo,
    layout: FileLayout,
    limits: dict[str, int] | None = None,
    dense_dtype: str = "float32",
) -> Part:
    """Memory-map the part file at `path` after checking its metadata against `layout` and `info`
    (open_part, less the checks of where the file lies)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise DatasetError(f"{path}: cannot open: {limit_message(e) or e.strerror}") from None
    try:
        st = os.fstat(fd)
        size = st.st_size
        if size != info.bytes:  # replaced since the manifest was written (or since the lstat)
            raise ChangedFileError(f"{path}: {size} bytes on disk, manifest says {info.bytes}")
        head = os.pread(fd, len(layout.head), 0)
        foot = os.pread(fd, len(layout.foot), max(size - len(layout.foot), 0))
        sizes = layout.check(head, foot, size)
        if isinstance(sizes, str):
            raise ChangedFileError(f"{path}: not the part the manifest describes: {sizes}")
        if sizes.rows != info.rows:
            raise ChangedFileError(f"{path}: holds {sizes.rows} rows, manifest says {info.rows}")
        for i, c in enumerate(layout.columns):
            if c.kind == LIST:
                _check_offsets(fd, path, c.name, layout, sizes, i)
        try:
            memory = map_open_file(fd, size, path)
        except OSError as e:
            raise DatasetError(f"{path}: cannot map: {limit_message(e) or e.strerror}") from None
    finally:
        os.close(fd)
    part = _views(Path(path), memory, layout, sizes, limits or {}, dense_dtype)
    part.residency_known = _residency_known(path, st)
    return part


def _residency_known(path: str, st: os.stat_result) -> bool:
    """Whether mincore reports the file's cached pages to this process (`Part.residency_known`):
    its owner, root, or a process that may write it."""
    uid = os.geteuid() if hasattr(os, "geteuid") else -1
    return uid in (0, st.st_uid) or os.access(path, os.W_OK)


def _check_offsets(
    fd: int, path: str, name: str, layout: FileLayout, sizes: arrow_ipc.Sizes, column: int
) -> None:
    """A list's offsets run from 0 to its values' length (their ends only: a monotonicity pass
    would read the whole buffer at every open; `data verify` does it)."""
    at = layout.body_at + sizes.buffers[layout.offsets_buffer[column]][0]
    first = int(np.frombuffer(os.pread(fd, 8, at), "<i8")[0])
    last = int(np.frombuffer(os.pread(fd, 8, at + 8 * sizes.rows), "<i8")[0])
    values = sizes.list_lengths[layout.lists.index(column)]
    if first != 0 or last != values:
        raise ChangedFileError(
            f"{path}: column {name}: offsets run from {first} to {last}, expected 0 to {values} "
            "(the column's ids)"
        )


_Place = tuple[str, np.dtype, int, int, int, int, int]
_Span = tuple[int, int, int]


@functools.lru_cache(maxsize=64)
def _places(
    layout: FileLayout, rows: int, lists: tuple[int, ...]
) -> tuple[tuple[_Place, ...], tuple[_Span, ...]]:
    """For a file of this layout, rows and list lengths: per column (name, dtype, width (0: not a
    block), its values' first and last byte in the file, its offsets' (-1: not a list)), and the
    read-ahead spans (`Part.read_spans`, at file offsets). The same for every full part of a
    dataset: reckoned once, not for each of the ~250 parts a shuffle group opens."""
    sizes, _, _ = layout.expected(rows, lists)
    body, buffers, places, spans = layout.body_at, sizes.buffers, [], []
    for i, c in enumerate(layout.columns):
        at, length = buffers[layout.values_buffer[i]]
        offsets = (-1, -1)
        if c.kind == LIST:
            o_at, o_length = buffers[layout.offsets_buffer[i]]
            offsets = (body + o_at, body + o_at + o_length)
            spans.append((body + o_at, 8, 1))
        elif length:
            spans.append((body + at, length // rows, 0))
        width = c.width if c.kind == BLOCK else 0
        places.append((c.name, c.dtype, width, body + at, body + at + length, *offsets))
    # read_ahead's order: labels, dense, one-hot ids, then the lists' offsets
    spans.sort(key=lambda span: span[2])
    return tuple(places), tuple(spans)


def _views(
    path: Path,
    memory: np.ndarray,
    layout: FileLayout,
    sizes: arrow_ipc.Sizes,
    limits: dict[str, int],
    dense_dtype: str,
) -> Part:
    rows = sizes.rows
    base = memory.ctypes.data if memory.size else None
    columns: dict[str, np.ndarray] = {}
    offsets: dict[str, np.ndarray] = {}
    addresses: dict[str, int] = {}
    offset_addresses: dict[str, int] = {}
    places, spans = _places(layout, rows, sizes.list_lengths)
    for name, dtype, width, a, z, o_a, o_z in places:
        values = memory[a:z].view(dtype)
        columns[name] = values.reshape(rows, width) if width else values
        if base is not None:
            addresses[name] = base + a
        if o_a >= 0:
            offsets[name] = memory[o_a:o_z].view(np.int64)
            if base is not None:
                offset_addresses[name] = base + o_a
    labels = columns.pop(LABEL)
    dense = columns.pop(DENSE, None)
    if dense is None:
        dense = np.empty((rows, 0), dense_dtype)
        dense.flags.writeable = False
    part = Part(path, rows, labels, dense, columns, offsets, limits, addresses, offset_addresses)
    if base is not None:
        part.read_spans, part.map_address = spans, base
    return part


def open_split(directory: str | Path, split: str, manifest: Manifest | None = None) -> list[Part]:
    """Memory-map every part of one split, checking each against the manifest."""
    directory = Path(directory)
    manifest = manifest or Manifest.load(directory)
    if split not in manifest.splits:
        raise DatasetError(
            f"{directory}: no split {split!r} (has {', '.join(manifest.splits) or 'none'})"
        )
    layout = manifest_layout(manifest, directory)
    return [open_part(directory, split, p, manifest, layout) for p in manifest.splits[split].parts]
