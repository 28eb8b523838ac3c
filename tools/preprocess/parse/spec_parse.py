"""A feature spec resolved against a file's fields (Program), and text parsed by it (SpecChunk).

`resolve_program` finds each spec column's field: by its `position`, else by name in the file's
header, else by its place in the spec; every field must belong to exactly one column (an unwanted
one is `role = "ignore"`), so that a misspelt name or a shifted file is one clear line, never a
silently wrong column. `criteo_schema` says when a resolved spec is Criteo's shape (label, integers,
hex categoricals, unquoted): such text goes through Criteo's own kernels (criteo_text.py), which are
faster and give the bytes they always gave. Any other spec goes through spec_kernel.
"""

from __future__ import annotations

import csv
import difflib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from shardrec.dataloader.spec.feature_spec import (
    CategoricalColumn,
    DenseColumn,
    FeatureSpec,
    LabelColumn,
    ListColumn,
    SequenceColumn,
    SpecError,
)
from shardrec.tools.preprocess.ids.id_maps import hash_bytes
from shardrec.tools.preprocess.parse import spec_kernel as k
from shardrec.tools.preprocess.parse.criteo_text import REASONS, ChunkRows, Schema, show_value
from shardrec.tools.preprocess.parse.spec_values import missing_hint
from shardrec.tools.preprocess.text.lines import check_text, count_newlines, csv_fields

_ROLE = {
    LabelColumn: k.LABEL,
    DenseColumn: k.DENSE,
    CategoricalColumn: k.CATEGORICAL,
    ListColumn: k.LIST,
    SequenceColumn: k.LIST,
}
_KIND = {"hex": k.HEX, "integer": k.INTEGER, "string": k.STRING, "int": k.INT, "float": k.FLOAT}


@dataclass(frozen=True, eq=False)
class Program:
    """What the kernel does with each field index of a row (arrays of one entry per field)."""

    spec: FeatureSpec
    names: tuple[str, ...]
    """Column name of each field (messages)."""
    role: np.ndarray
    slot: np.ndarray
    """Index of the field's column among the dense, one-hot or list columns."""
    kind: np.ndarray
    seps: np.ndarray
    max_lengths: np.ndarray
    label_field: int
    min_fields: int
    flags: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    """List fields: spec_kernel.KEEP_LAST (a sequence) and RAW (integers kept as written)."""
    primary: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    """A side sequence's primary field (-1 for every other field)."""
    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    """Label mapping: hashes of the written values (ids.hash_bytes), and their labels beside
    them."""
    values: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    words: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    """The words for a missing value ([format] missing) back to back, word t at
    words[starts[t] : starts[t + 1]] (spec_values.is_missing)."""
    starts: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))

    @property
    def num_fields(self) -> int:
        return len(self.names)

    @property
    def one_hot(self) -> list[CategoricalColumn]:
        return [c for c in self.spec.sparse if not isinstance(c, ListColumn)]

    @property
    def features(self) -> list[tuple[str, bool, int]]:
        """(name, is a list, slot among its kind) of every sparse feature, in spec (manifest)
        order."""
        out, counts = [], [0, 0]
        for c in self.spec.sparse:
            is_list = isinstance(c, ListColumn)
            out.append((c.name, is_list, counts[is_list]))
            counts[is_list] += 1
        return out


def read_header(path: Path, spec: FeatureSpec) -> list[str]:
    """The column names of a file's first line (quotes read as the spec's format reads them)."""
    from shardrec.tools.preprocess.text.gz import open_text

    with open_text(path) as f:
        line = f.readline()
    check_text(path, line, 1)
    text = line.decode("utf-8", "replace").lstrip("\ufeff").rstrip("\r\n")
    quoting = csv.QUOTE_MINIMAL if spec.format.quoting else csv.QUOTE_NONE
    return next(iter(csv_fields(text, spec.format.delimiter, quoting)), [])


def _positions(
    spec: FeatureSpec, header: list[str] | None, where: str, spec_name: str, editable: bool
) -> list[int]:
    """The field index of each spec column."""
    out = []
    placed = {c.position for c in spec.columns if c.position is not None}
    for i, c in enumerate(spec.columns):
        if c.position is not None:
            out.append(c.position)
        elif header is None:
            out.append(i)
        elif c.name in header:
            named = [f for f, h in enumerate(header) if h == c.name and f not in placed]
            if len(named) > 1:  # which one it is, only the user knows
                fix = (
                    f"give {c.name!r} in {spec_name} the position of the field it reads, and "
                    'each other one a [[columns]] of its own with its position (role = "ignore" '
                    "to skip it), as `spec infer` does"
                    if editable
                    else "rename all but one in the file's header"
                )
                raise SpecError(
                    f"{where}: the header names {c.name!r} {len(named)} times (fields "
                    f"{', '.join(map(str, named))}; 0 is the first): {fix}"
                )
            out.append(named[0] if named else header.index(c.name))
        elif (
            len(header) == 1 and len(spec.columns) > 1
        ):  # another format: a TSV (Criteo's rows) read as CSV, ...
            kind = f"{spec.format.kind.upper()} ({spec.format.delimiter!r} between fields)"
            names = ", ".join(col.name for col in spec.columns[:4])
            raise SpecError(
                f"{where}: its first line has no {spec.format.delimiter!r}: {spec_name} reads {kind} with a header "
                f"({names}, ...); this file is in another format"
            )
        else:
            near = difflib.get_close_matches(c.name, header, n=1)
            hint = f"; did you mean {near[0]}?" if near else f" (it has {', '.join(header[:12])})"
            raise SpecError(
                f"{where}: the header has no column {c.name!r} that {spec_name} names{hint}"
            )
    return out


def resolve_program(
    spec: FeatureSpec,
    header: list[str] | None,
    where: str,
    spec_name: str = "the spec",
    editable: bool = True,
) -> Program:
    """Each field's role for the kernel. header: the file's column names (when the format has one).

    where: the data file, first in every message; spec_name: the spec file, named in them too;
    editable: the user can add a column to the spec (not to a model's).
    """
    fields = _positions(spec, header, where, spec_name, editable)
    nf = max(max(fields) + 1, len(header or []))
    owner: dict[int, str] = {}
    for c, f in zip(spec.columns, fields):
        if f in owner:
            raise SpecError(
                f"{where}: field {f} is both {owner[f]!r} and {c.name!r} in {spec_name}"
            )
        owner[f] = c.name
    lost = [f for f in range(nf) if f not in owner]
    if lost:
        what = (
            repr(header[lost[0]])
            if header and lost[0] < len(header)
            else f"field {lost[0]} (0 is the first)"
        )
        if editable:
            raise SpecError(
                f'{where}: column {what} is in no [[columns]] of {spec_name}; add it with role = "ignore" to skip it'
            )
        width = len(spec.columns)
        cut = ""
        if not spec.format.quoting and min(lost) >= width:
            d = "" if spec.format.delimiter == "\t" else f"-d'{spec.format.delimiter}' "
            cut = f"; if the extra ones are the last: `cut {d}-f1-{width} {where} > rows.txt`"
        raise SpecError(
            f"{where}: column {what} is in none of the {width} columns {spec_name} reads, as its "
            f"training data had{cut}"
        )
    role, slot, kind = np.zeros(nf, np.int8), np.zeros(nf, np.int32), np.zeros(nf, np.int8)
    seps, max_lengths = np.full(nf, 10, np.uint8), np.zeros(nf, np.int32)
    counts = {k.DENSE: 0, k.CATEGORICAL: 0, k.LIST: 0}
    flags, primary = np.zeros(nf, np.int8), np.full(nf, -1, np.int32)
    field_of = {c.name: f for c, f in zip(spec.columns, fields)}
    for c, f in zip(spec.columns, fields):
        role[f] = _ROLE.get(type(c), k.IGNORE)
        if isinstance(c, SequenceColumn):
            flags[f] = k.KEEP_LAST | (k.RAW if c.raw else 0)
            if c.side_of:
                primary[f] = field_of[c.side_of]
        if role[f] in counts:
            slot[f], counts[role[f]] = counts[role[f]], counts[role[f]] + 1
        if isinstance(c, (DenseColumn, CategoricalColumn)):
            kind[f] = _KIND[c.type if isinstance(c, DenseColumn) else c.kind]
        if isinstance(c, ListColumn):
            seps[f], max_lengths[f] = ord(c.separator), c.max_length
    for f in fields:  # a side keeps as many values as its primary
        if primary[f] >= 0:
            max_lengths[f] = max_lengths[primary[f]]
    label = spec.label
    keys = np.array([hash_bytes(v.encode()) for v in label.mapping], np.uint64)
    values = np.array(list(label.mapping.values()), np.uint8)
    names = tuple(owner[f] for f in range(nf))
    min_fields = spec.format.min_fields or nf
    missing = [w.encode() for w in spec.format.missing]
    words = np.frombuffer(b"".join(missing), np.uint8).copy()
    starts = np.cumsum([0, *map(len, missing)], dtype=np.int64)
    return Program(spec, names, role, slot, kind, seps, max_lengths, fields[spec.columns.index(label)], min_fields,
                   flags, primary, keys, values, words, starts)  # fmt: skip


def criteo_schema(program: Program) -> tuple[Schema, str] | None:
    """(Schema, dense transform) when the resolved spec is Criteo's shape, read by Criteo's kernels:
    unquoted, no words for a missing value; label first (0/1 as written); then integers, one
    transform for all; then hex categoricals."""
    spec, fmt = program.spec, program.spec.format
    dense, sparse = spec.dense, spec.sparse
    shape = [spec.label, *dense, *sparse]
    order = [program.names.index(c.name) for c in shape]
    if (
        fmt.quoting
        or fmt.missing
        or order != list(range(program.num_fields))
        or spec.label.threshold is not None
        or spec.label.mapping
        or any(d.type != "int" or d.transform != dense[0].transform for d in dense)
        or any(isinstance(c, ListColumn) or c.kind != "hex" for c in sparse)
    ):
        return None
    try:
        schema = Schema(len(dense), len(sparse), fmt.delimiter, fmt.header, program.min_fields)
    except ValueError:  # a delimiter Criteo's parser cannot take (a digit, a letter of hex)
        return None
    return schema, dense[0].transform if dense else "log1p"


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
