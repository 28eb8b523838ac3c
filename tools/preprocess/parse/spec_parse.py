"""Text parsed by a resolved feature spec (spec_program.Program) into a SpecChunk, and the one
line that says why a malformed row is (describe_bad_spec_row).

The parsing itself is spec_kernel's; Criteo-shaped specs go through Criteo's own kernels instead
(spec_program.criteo_schema).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field

import numpy as np

from shardrec.tools.preprocess.parse import spec_kernel as k
from shardrec.tools.preprocess.parse.criteo_text import REASONS, ChunkRows, show_value
from shardrec.tools.preprocess.parse.spec_program import Program
from shardrec.tools.preprocess.parse.spec_values import missing_hint
from shardrec.tools.preprocess.text.lines import count_newlines, csv_fields


@dataclass
class SpecChunk(ChunkRows):
    """Every row of a piece of text parsed by a spec; rows with reason >= 0 are malformed
    (REASONS)."""

    labels: np.ndarray  # uint8 [rows]
    dense: np.ndarray  # float64 [rows, dense columns], 0 where missing
    dense_missing: np.ndarray  # bool
    sparse: np.ndarray  # uint64 [rows, one-hot columns] (the values ids are made from)
    sparse_missing: np.ndarray  # bool
    list_values: np.ndarray  # uint64, every list value of the piece
    list_start: (
        np.ndarray
    )  # int64 [rows, list columns]: first value of the row's list in list_values
    list_len: np.ndarray  # int32 [rows, list columns]
    list_total: np.ndarray  # int32 [rows, list columns]: values in the field, list_len kept of them
    reason: np.ndarray  # int8 [rows]
    bad_field: np.ndarray  # int16 [rows]: field index of the first bad field
    row_start: np.ndarray  # int64 [rows]
    row_end: np.ndarray  # int64 [rows]: offset of the row's newline
    dictionaries: dict[int, DictionaryValues] = field(default_factory=dict)
    """One-hot columns (by slot) given as a dictionary of values and each row's index into it,
    not in `sparse` (a Parquet column read as a dictionary, in hashing mode: each distinct value
    is hashed once)."""
    ends_in_quote: bool = False
    """The piece's last line leaves a quote open: the next piece of the same text starts inside
    that field (parse_spec_chunk's in_quote)."""


@dataclass
class DictionaryValues:
    """A column as distinct values and each row's index: values[indices[at + r]] is row r's value
    unless bit at + r of `valid` is clear (a null; an empty bitmap: no nulls) or the entry is
    absent (an empty value)."""

    values: np.ndarray  # uint64 [entries]
    absent: np.ndarray  # bool [entries]
    indices: np.ndarray  # int8/16/32/64 [at + rows]
    valid: np.ndarray  # uint8 validity bitmap, or empty
    at: int


def _list_bound(buf: np.ndarray, rows: int, program: Program) -> int:
    """Most list values the piece can hold: per list field, a value per separator byte plus one per
    row."""
    bound = 0
    for f in np.flatnonzero(program.role == k.LIST):
        seps = int(np.count_nonzero(buf == program.seps[f]))
        bound += min(int(program.max_lengths[f]) * rows, seps + rows)
    return bound


def parse_spec_chunk(
    data: bytes | memoryview | np.ndarray, program: Program, in_quote: bool = False
) -> SpecChunk:
    """Parse whole lines (data ends with a newline) by the spec's program. in_quote: the text
    before data (the piece before it) left a quote open: its first lines are inside that field,
    as the chunk's `ends_in_quote` says of the next piece."""
    buf = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    if len(buf) and buf[-1] != 10:
        raise ValueError("parse_spec_chunk needs text that ends with a newline")
    if buf.flags.writeable:  # one compiled signature for bytes and bytearray input
        buf = buf.view()
        buf.flags.writeable = False
    rows = int(count_newlines(buf)) if len(buf) else 0
    nd, ns, nl = (
        int(np.count_nonzero(program.role == r)) for r in (k.DENSE, k.CATEGORICAL, k.LIST)
    )
    bound = _list_bound(buf, rows, program)
    out = SpecChunk(
        np.zeros(rows, np.uint8), np.empty((rows, nd), np.float64), np.empty((rows, nd), bool),
        np.empty((rows, ns), np.uint64), np.empty((rows, ns), bool), np.empty(bound, np.uint64),
        np.empty((rows, nl), np.int64), np.empty((rows, nl), np.int32),
        np.empty((rows, nl), np.int32), np.empty(rows, np.int8), np.empty(rows, np.int16),
        np.empty(rows, np.int64), np.empty(rows, np.int64),
    )  # fmt: skip
    if not rows:
        out.ends_in_quote = in_quote
        return out
    label = program.spec.label
    mode = k.MAPPING if label.mapping else k.THRESHOLD if label.threshold is not None else k.BINARY
    fmt = program.spec.format
    done, used, out.ends_in_quote = k.parse_spec_rows(
        buf, ord(fmt.delimiter), fmt.quoting, ord(fmt.decimal or "."), program.min_fields, program.role,
        program.slot, program.kind, program.seps, program.max_lengths, program.label_field, mode,
        float(label.threshold or 0.0), program.keys, program.values, out.labels, out.dense, out.dense_missing,
        out.sparse, out.sparse_missing, out.list_values, out.list_start, out.list_len, out.list_total,
        out.reason, out.bad_field, out.row_start, out.row_end, program.flags, program.primary,
        in_quote, program.words, program.starts,
    )  # fmt: skip
    assert done == rows and used >= 0, "the list bound covers every value"
    return out


def _quoted_field(line: bytes, fidx: int, delimiter: bytes) -> str:
    """The text of a line's field `fidx` (a bad quote in it) to the line's end, and, for a quote
    still open there, why: a line break inside quotes (a multi-line field) ends the row."""
    start, inside = 0, False
    for i in range(len(line)):
        c = line[i : i + 1]
        if c == b'"':
            inside = not inside
        elif c == delimiter and not inside:
            fidx -= 1
            if fidx < 0:
                break
            start = i + 1
    if fidx > 0:  # fewer fields than the index: the whole line
        start = 0
    value = show_value(line[start:])
    if line.count(b'"') % 2:
        value += " (its quote is not closed on the line: a line break inside quotes is not read)"
    return value


def _too_many_fields(fields: list[str], columns: int, delimiter: str) -> str:
    """What a row of more fields than the spec's columns holds; where the extra ones are empty (a
    delimiter that ends every row, as some writers add), the columns that take them."""
    said = f"{len(fields)} fields, the spec has {columns}"
    extra = len(fields) - columns
    if any(fields[columns:]):
        return said
    where = f"position = {columns}" if extra == 1 else f"positions {columns} to {len(fields) - 1}"
    return (
        f"{said}, the last {'one' if extra == 1 else extra} empty (the row ends with "
        f"{delimiter!r}); add "
        f'{"a column" if extra == 1 else f"{extra} columns"} of role = "ignore" at {where}'
    )


def describe_bad_spec_row(
    data: bytes, chunk: SpecChunk, row: int, program: Program
) -> tuple[str, str]:
    """(column name, offending value) of a malformed row, for `file:line: column: value`
    messages."""
    code, fidx = int(chunk.reason[row]), int(chunk.bad_field[row])
    line = bytes(data[int(chunk.row_start[row]) : int(chunk.row_end[row])]).removesuffix(b"\r")
    reason = REASONS[code]
    if reason == "empty_row":
        return "row", "(empty line)"
    fmt = program.spec.format
    text = line.decode("utf-8", "replace")
    if reason == "bad_quote" and fidx >= program.num_fields:  # spec_kernel's line in a field
        why = "a line before it left a quote open: a line break inside quotes is not read"
        return "row", f"{show_value(line)} ({why})"
    if reason == "bad_quote":
        return program.names[fidx], _quoted_field(line, fidx, fmt.delimiter.encode())
    quoting = csv.QUOTE_MINIMAL if fmt.quoting else csv.QUOTE_NONE
    fields = next(iter(csv_fields(text, fmt.delimiter, quoting)), [])
    if reason == "too_many_fields":
        return "row", _too_many_fields(fields, program.num_fields, fmt.delimiter)
    if reason == "too_few_fields":
        return (
            "row",
            f"{len(fields)} fields, the spec needs at least {program.min_fields} of {program.num_fields}",
        )
    value = fields[fidx] if fidx < len(fields) else ""
    hint = missing_hint(value, reason, fmt.missing)  # `NA` among numbers: the key that reads it
    return program.names[fidx], show_value(value.encode()) + hint
