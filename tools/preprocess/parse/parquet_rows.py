"""Parquet click logs read by a feature spec (`[format] kind = "parquet"`): a file's columns checked
against the spec (parquet_schema.py), its row groups planned into tasks, and each row group decoded
into the same SpecChunk the text parser makes (spec_parse.py), so the rest of preprocessing (ids,
dense transforms, parts, vocabularies, splits, markers) is the text path's.

Columns are found by name; every column of the file belongs to one spec column (`role =
"ignore"` for the unwanted), as every field of a text row does. What each role takes:

- label: integer, bool or float holding 0/1; any number with `threshold`; a string column with
  `mapping`. A null label makes the row malformed.
- dense: integer, float or bool; null is 0, a NaN or an infinity a malformed row (bad_float),
  and so is a float with a fraction in a `type = "int"` column (bad_integer), as `1.5` in text.
- categorical of kind `string`: a string or binary column, its bytes hashed as a text field's
  are; `hex`: a string column of hex digits (anything else: a malformed row); `integer`: an
  integer column, the integer itself, or a float column of whole numbers (as pandas writes an
  integer column that has nulls), each the integer it is: a fraction, a NaN, an infinity or a
  value at or past the float type's last exact integer (2^53 for float64, 2^24 for float32, 2^11
  for float16: past it distinct ids may have been rounded to one float) makes a malformed row
  (bad_integer).
- list: a list (or large_list) of strings (kinds `string`, `hex`) or of integers (`integer`),
  each element read as its kind; null and empty elements are skipped, the first `max_length`
  kept.

A null or empty value is missing (id 0). A row group is read with pyarrow (`use_threads=False`:
the workers are the parallelism); the values are decoded from Arrow's buffers by
parquet_kernel.py. String categoricals whose values repeat (a dictionary under a quarter of the
first row group's rows) are read as dictionaries (`read_dictionary`): each distinct value is
decoded once and the rows take their index's, and Parquet's decoding skips building every string
(measured: a third of the decoding time). Near-unique columns are read plain: pyarrow would build
a dictionary of every value. Which columns are read so is a per-file choice that never changes
the output (the values are the same either way).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardrec.dataloader.spec.feature_spec import CategoricalColumn, LabelColumn, ListColumn
from shardrec.tools.preprocess.parse import parquet_kernel as pk
from shardrec.tools.preprocess.parse import spec_kernel as k
from shardrec.tools.preprocess.parse.criteo_text import REASONS, show_value
from shardrec.tools.preprocess.parse.parquet_schema import (
    FLOAT_EXACT_BITS,
    ParquetProgram,
    float_bits,
)
from shardrec.tools.preprocess.parse.spec_parse import DictionaryValues, SpecChunk

logger = logging.getLogger(__name__)


def _pa():
    import pyarrow as pa

    return pa


@dataclass(frozen=True)
class RowGroups:
    """A task's share of a Parquet file: row groups [first, last), their rows and bytes."""

    first: int
    last: int
    rows: int
    bytes: int
    first_row: int


def plan_row_groups(path: Path, chunk_bytes: int) -> list[RowGroups]:
    """The file's row groups in runs of at least `chunk_bytes` (uncompressed, from its metadata;
    none is read): the tasks of one file, a pure function of the file."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    out, first, rows, size, at = [], 0, 0, 0, 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        rows, size = rows + rg.num_rows, size + rg.total_byte_size
        if size >= chunk_bytes or g == meta.num_row_groups - 1:
            out.append(RowGroups(first, g + 1, rows, size, at))
            first, at, rows, size = g + 1, at + rows, 0, 0
    return out


def file_rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def _reusing_pool() -> None:
    """pyarrow's allocations from a pool that keeps freed pages for the next row group (jemalloc;
    else the system's). Its default, mimalloc, gave freed pages back and the next row group's
    were zeroed again by the kernel: ~0.3 CPU-s of system time per million Criteo-shaped rows
    read, as much as their decoding's half (measured reading each row group twice)."""
    pa = _pa()
    if pa.default_memory_pool().backend_name != "mimalloc":
        return
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:  # a pyarrow built without jemalloc
        pa.set_memory_pool(pa.system_memory_pool())


def read_row_groups(
    path: Path, first: int, last: int, pp: ParquetProgram, columns: list[str] | None = None
):
    """Row groups [first, last) of a file, each as (its used columns, or `columns`, as a pyarrow
    Table, its uncompressed bytes as the metadata says), read one at a time on this thread."""
    import pyarrow.parquet as pq

    _reusing_pool()
    # memory-mapped: the pages are decoded in place (reads copied ~0.08 s of system time per
    # 200 MB file more)
    f = pq.ParquetFile(path, read_dictionary=list(pp.dictionary) or None, memory_map=True)
    for g in range(first, last):
        table = f.read_row_group(g, columns=columns or pp.columns, use_threads=False)
        yield _typed_nulls(table, pp), f.metadata.row_group(g).total_byte_size


def _typed_nulls(table, pp: ParquetProgram):
    """`table` with its columns of nulls only (Arrow's null type, as pandas writes a column of
    None) cast to the type their spec column reads: the decoders then read them as they read any
    column's nulls, as missing values. By the table's own types: the files of one run share one
    ParquetProgram, and another file's column may hold values."""
    pa = _pa()
    columns = {c.name: c for c in pp.program.spec.columns}
    for i, field in enumerate(table.schema):
        c = columns.get(field.name)
        if not pa.types.is_null(field.type) or c is None or isinstance(c, LabelColumn):
            continue  # a label of nulls only was refused by name (parquet_schema)
        if isinstance(c, (CategoricalColumn, ListColumn)):
            kind = pa.int64() if c.kind == "integer" else pa.large_string()
            kind = pa.large_list(kind) if isinstance(c, ListColumn) else kind
        else:
            kind = pa.float64()
        table = table.set_column(i, field.name, table.column(i).cast(kind))
    return table


def _chunks(column, dictionaries: bool = False):
    """The Arrow arrays of a column (dictionaries decoded but where `dictionaries`), string views
    as strings."""
    pa = _pa()
    for arr in column.chunks:
        if pa.types.is_dictionary(arr.type) and not dictionaries:
            arr = arr.dictionary_decode()
        if getattr(pa.types, "is_string_view", lambda _: False)(arr.type):
            arr = arr.cast(pa.large_string())
        if getattr(pa.types, "is_binary_view", lambda _: False)(arr.type):
            arr = arr.cast(pa.large_binary())
        yield arr


def _buffer(buf, dtype) -> np.ndarray:
    return np.frombuffer(buf, dtype) if buf is not None else np.zeros(0, dtype)


def _offsets_dtype(arr) -> type:
    pa = _pa()
    t = arr.type
    large = pa.types.is_large_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_list(t)
    return np.int64 if large else np.int32


def _integers(arr) -> np.ndarray:
    """A numeric array's values buffer as numpy, indexed from the buffer's start (the array's
    offset applies); booleans and float16 are cast first (to int8, float32), keeping the offset:
    the cast array's buffer then starts at the original's offset 0."""
    pa = _pa()
    if pa.types.is_boolean(arr.type) or pa.types.is_float16(arr.type):
        whole = pa.concat_arrays([pa.nulls(arr.offset, arr.type), arr]) if arr.offset else arr
        arr = whole.cast(pa.int8() if pa.types.is_boolean(arr.type) else pa.float32())
    return _buffer(arr.buffers()[1], arr.type.to_pandas_dtype())


def _unsure(arrow_type) -> bool:
    """Whether a column of this type may hold values no integer dense field takes (a fraction,
    or past +-2^63): floats and uint64 only, so integer columns skip numbers_into's per-value test
    (Criteo's 13 integer columns)."""
    pa = _pa()
    return pa.types.is_floating(arrow_type) or pa.types.is_uint64(arrow_type)


def _label(arr, c: LabelColumn, pp: ParquetProgram, out: SpecChunk, r0: int, field: int) -> None:
    n = len(arr)
    if c.mapping:
        offsets = _buffer(arr.buffers()[1], _offsets_dtype(arr))
        data = _buffer(arr.buffers()[2], np.uint8)
        bitmap = _buffer(arr.buffers()[0], np.uint8)
        pk.mapped_labels_into(offsets, data, bitmap, arr.offset, n, pp.program.keys,
                              pp.program.values, out.labels, r0, out.reason, out.bad_field, field)  # fmt: skip
        return
    pk.number_labels_into(
        _integers(arr), _buffer(arr.buffers()[0], np.uint8), arr.offset, n,
        float(c.threshold or 0.0), c.threshold is not None, out.labels, r0, out.reason,
        out.bad_field, field,
    )  # fmt: skip


def _categorical(
    arr, c: CategoricalColumn, slot: int, out: SpecChunk, r0: int, field: int, whole: bool = False
) -> None:
    """Column `slot` of rows r0 .. r0 + len(arr). whole: the array is the column's only one, and
    a dictionary stays one (out.dictionaries: its ids are made per distinct value)."""
    n, bitmap = len(arr), _buffer(arr.buffers()[0], np.uint8)
    if _pa().types.is_dictionary(arr.type):
        values, absent, codes = _entries(arr.dictionary, c, field)
        indices = _buffer(arr.buffers()[1], arr.type.index_type.to_pandas_dtype())
        if whole:
            out.dictionaries[slot] = DictionaryValues(values, absent, indices, bitmap, arr.offset)
            if (codes >= 0).any():
                pk.mark_bad_entries(indices, bitmap, arr.offset, n, codes, r0, out.reason,
                                    out.bad_field, field)  # fmt: skip
            return
        pk.dictionary_into(indices, bitmap, arr.offset, n, values, absent, codes, out.sparse,
                           out.sparse_missing, slot, r0, out.reason, out.bad_field, field)  # fmt: skip
        return
    if c.kind == "integer" and _pa().types.is_floating(arr.type):
        # The bound is the file's type's: _integers widens float16 to float32, exactly.
        exact = 2.0 ** FLOAT_EXACT_BITS[float_bits(arr.type)]
        pk.float_ids_into(_integers(arr), bitmap, arr.offset, n, exact, out.sparse,
                          out.sparse_missing, slot, r0, out.reason, out.bad_field, field)  # fmt: skip
        return
    if c.kind == "integer":
        pk.integers_into(
            _integers(arr), bitmap, arr.offset, n, out.sparse, out.sparse_missing, slot, r0
        )
        return
    offsets = _buffer(arr.buffers()[1], _offsets_dtype(arr))
    data = _buffer(arr.buffers()[2], np.uint8)
    kind = k.HEX if c.kind == "hex" else k.STRING
    pk.strings_into(offsets, data, bitmap, arr.offset, n, kind, out.sparse, out.sparse_missing, slot,
                    r0, out.reason, out.bad_field, field)  # fmt: skip


_DECODED: dict[tuple[str, str], tuple] = {}


def _entries(entries, c: CategoricalColumn, field: int) -> tuple[np.ndarray, ...]:
    """(value, absent: null or empty, reason code or -1) of each entry of a dictionary, decoded as
    a column's values are. Each column's last ones are kept, and given again (the same arrays,
    never written to after) for an equal dictionary: pyarrow gives each row group its own, equal
    from row group to row group in a file written from dictionaries (pandas categoricals, Arrow
    dictionary arrays). The check costs ~1 us where they differ, ~4 us for 3 K equal entries
    against ~120 us to decode them."""
    key = (c.name, c.kind)
    held = _DECODED.get(key)
    if held is not None and held[0].equals(entries):
        return held[1:]
    m = len(entries)
    values, absent = np.zeros((m, 1), np.uint64), np.zeros((m, 1), bool)
    codes, unused = np.full(m, -1, np.int8), np.zeros(m, np.int16)
    _categorical(entries, c, 0, SpecChunk(*([None] * 3), values, absent, *([None] * 4), codes,
                                          unused, None, None), 0, field)  # fmt: skip
    _DECODED[key] = (entries, values[:, 0], absent[:, 0], codes)
    return _DECODED[key][1:]


def _list(arr, c: ListColumn, slot: int, out: SpecChunk, r0: int, field: int, pos: int) -> int:
    n = len(arr)
    list_offsets = _buffer(arr.buffers()[1], _offsets_dtype(arr))
    list_bitmap = _buffer(arr.buffers()[0], np.uint8)
    child = arr.values  # not sliced by the parent: list offsets index it from its own offset
    if _pa().types.is_dictionary(child.type):
        child = child.dictionary_decode()
    bitmap = _buffer(child.buffers()[0], np.uint8)
    if c.kind == "integer":
        return pk.integer_lists_into(
            list_offsets, list_bitmap, arr.offset, n, _integers(child), bitmap, child.offset,
            c.max_length, out.list_values, pos, out.list_start, out.list_len, out.list_total, slot,
            r0,
        )  # fmt: skip
    offsets = _buffer(child.buffers()[1], _offsets_dtype(child))
    data = _buffer(child.buffers()[2], np.uint8)
    kind = k.HEX if c.kind == "hex" else k.STRING
    return pk.string_lists_into(
        list_offsets, list_bitmap, arr.offset, n, offsets, data, bitmap, child.offset, kind,
        c.max_length, out.list_values, pos, out.list_start, out.list_len, out.list_total, slot, r0,
        out.reason, out.bad_field, field,
    )  # fmt: skip


def _list_bound(table, pp: ParquetProgram) -> int:
    """Most list values a row group can give: its list columns' elements (a row keeps at most
    max_length of them)."""
    bound = 0
    for c in pp.program.spec.lists:
        column = table.column(c.name)
        bound += sum(min(len(a.values), c.max_length * len(a)) for a in column.chunks)
    return bound


_SCRATCH: dict[str, np.ndarray] = {}


def _scratch(name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised column-major array of this shape, the same memory as the last one asked
    for under `name` where it is as large (a row group's chunk is consumed before the next is
    decoded)."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    held = _SCRATCH.get(name)
    if held is None or held.nbytes < size:
        held = _SCRATCH[name] = np.empty(max(size, 1), np.uint8)
    return held[:size].view(dtype).reshape(shape, order="F")


def table_chunk(table, pp: ParquetProgram, hashing: bool = False) -> SpecChunk:
    """A row group's rows, decoded as the text parser decodes a piece of text (SpecChunk).
    hashing: ids are hashed from the values (not looked up in vocabularies): a column read as a
    dictionary is given as one (SpecChunk.dictionaries), its values not spread over its rows."""
    program = pp.program
    rows = table.num_rows
    nd, ns, nl = (
        int(np.count_nonzero(program.role == r)) for r in (k.DENSE, k.CATEGORICAL, k.LIST)
    )
    bound = _list_bound(table, pp)
    # Column-major: a column is written at once, contiguously (row-major, each of the 26 passes
    # of a Criteo-shaped row group touched every cache line of the whole array); the consumers
    # read a row's columns as 26 sequential streams. Every entry is written by the decoders (the
    # arrays are reused from row group to row group: fresh pages were a third of the CPU time).
    out = SpecChunk(
        _scratch("labels", (rows,), np.uint8), _scratch("dense", (rows, nd), np.float64),
        _scratch("dense_missing", (rows, nd), bool), _scratch("sparse", (rows, ns), np.uint64),
        _scratch("sparse_missing", (rows, ns), bool), _scratch("lists", (bound,), np.uint64),
        _scratch("list_start", (rows, nl), np.int64), _scratch("list_len", (rows, nl), np.int32),
        _scratch("list_total", (rows, nl), np.int32),
        _scratch("reason", (rows,), np.int8), _scratch("bad_field", (rows,), np.int16),
        _scratch("row_start", (rows,), np.int64), _scratch("row_end", (rows,), np.int64),
    )  # fmt: skip
    out.reason[:] = -1
    pos = 0
    for c in program.spec.columns:
        f = program.names.index(c.name)
        role, slot = program.role[f], int(program.slot[f])
        if role == k.IGNORE:
            continue
        r0 = 0
        column = table.column(c.name)
        whole = hashing and column.num_chunks == 1
        for arr in _chunks(column, dictionaries=role == k.CATEGORICAL):
            if role == k.LABEL:
                _label(arr, c, pp, out, r0, f)
            elif role == k.DENSE:
                pk.numbers_into(_integers(arr), _buffer(arr.buffers()[0], np.uint8), arr.offset,
                                len(arr), out.dense, out.dense_missing, slot, r0, out.reason,
                                out.bad_field, f, program.kind[f] == k.INT and _unsure(arr.type))  # fmt: skip
            elif role == k.CATEGORICAL:
                _categorical(arr, c, slot, out, r0, f, whole)
            else:
                pos = _list(arr, c, slot, out, r0, f, pos)
            r0 += len(arr)
    return out


def describe_bad_row(table, chunk: SpecChunk, row: int, pp: ParquetProgram) -> tuple[str, str]:
    """(column name, offending value) of a malformed row of a row group."""
    name = pp.program.names[int(chunk.bad_field[row])]
    value = table.column(name)[row].as_py()
    if value is None:
        return name, "null"
    if REASONS[int(chunk.reason[row])] == "bad_label" or not isinstance(value, (str, bytes)):
        return name, repr(value)
    return name, show_value(value.encode() if isinstance(value, str) else value)
