"""The parser for Criteo-shaped click-log text: no per-row Python.

Two engines give identical results: a compiled one-pass kernel (parse_kernel, numba), used
when numba is installed, and the vectorized numpy path below, kept as the fallback and as the
reference the tests compare against. The numpy path parses a chunk of bytes that ends at a
newline in a fixed number of passes:

1. the positions of every delimiter and newline are found at once (`flatnonzero`);
2. each position gets its row (a running count of newlines) and its field index within the
   row (its rank among the row's separators). Rows with fewer fields than the schema are
   right-padded with empty fields by construction, never shifted; rows with more, or with
   fewer than `Schema.min_fields`, are flagged;
3. each field's [start, end) byte range lands in a [rows, fields] matrix;
4. integer and hex fields are decoded column-wise with lookup tables and Horner's rule over
   right-aligned characters, and the same tables flag non-digit / non-hex characters.

Row rules (from the real Criteo files):
- a missing value is an empty field; its mask is returned next to the value;
- Criteo's writer strips trailing empty fields (rows of 37 or 38 fields instead of 40), so a
  short row is right-padded, but only down to `Schema.min_fields` (default: all fields but 3);
  a shorter row (`1\t2`) is malformed (`too_few_fields`), not a row of missing values;
- integers may be negative (I2 holds -1, -2, -3); `260.0` is accepted as 260 (the CSV copy);
- categoricals are hex, up to 16 characters, decoded as uint64 (8-char Criteo values keep all
  32 bits; nothing goes through float32, so ids above 2^24 are exact);
- a trailing '\\r' before the newline is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from shardrec.tools.preprocess.parse import parse_kernel
from shardrec.tools.preprocess.parse.parse_fields import (
    decode_hex,
    decode_int,
    padded,
    strip_point_zero,
)
from shardrec.tools.preprocess.parse.spec_values import missing_hint
from shardrec.tools.preprocess.text.lines import count_newlines

NEWLINE = 10
CR = 13

# Reasons a row is skipped, in the order they are checked (a row reports its first).
# The last two come from the feature-spec parser only (spec_kernel): a float column, CSV quotes.
REASONS = (
    "empty_row", "too_many_fields", "too_few_fields", "bad_label", "bad_integer", "bad_hex", "bad_float", "bad_quote",
    "side_length",
)  # fmt: skip

# Trailing empty fields that real Criteo rows have stripped at most (37 of 40 fields).
MAX_STRIPPED_FIELDS = 3


@dataclass(frozen=True)
class Schema:
    """The shape of one text row: label, then dense integers, then hex categoricals."""

    num_dense: int = 13
    """Integer columns after the label."""
    num_sparse: int = 26
    """Hex categorical columns after the integers."""
    delimiter: str = "\t"
    """Field separator, one byte: a tab unless given ('\\t' is read as a tab)."""
    header: bool = False
    """Each file starts with a header line to skip."""
    min_fields: int | None = None
    """Fewest fields a row may have; its missing trailing fields are empty. Shorter rows are
    malformed (too_few_fields: skipped, or --strict stops). Default: all fields but 3 (37 for
    Criteo, whose writer strips up to 3 trailing empty fields)."""

    def __post_init__(self) -> None:
        if len(self.delimiter.encode()) != 1 or self.delimiter in "\r\n.-0123456789abcdefABCDEF":
            raise ValueError(
                f"delimiter {self.delimiter!r} must be one byte that cannot occur in a value"
            )
        if self.num_dense < 0 or self.num_sparse < 0:
            raise ValueError(
                f"num_dense={self.num_dense}, num_sparse={self.num_sparse} must be >= 0"
            )
        if (
            self.min_fields is None
        ):  # resolved here, so fingerprints and manifests record the number
            object.__setattr__(self, "min_fields", max(1, self.num_fields - MAX_STRIPPED_FIELDS))
        if not 1 <= self.min_fields <= self.num_fields:
            raise ValueError(
                f"min_fields={self.min_fields} must be between 1 and the row's {self.num_fields} fields"
            )

    @property
    def num_fields(self) -> int:
        return 1 + self.num_dense + self.num_sparse

    @property
    def dense_names(self) -> list[str]:
        return [f"I{i}" for i in range(1, self.num_dense + 1)]

    @property
    def sparse_names(self) -> list[str]:
        return [f"C{i}" for i in range(1, self.num_sparse + 1)]

    @property
    def field_names(self) -> list[str]:
        return ["label", *self.dense_names, *self.sparse_names]


class ChunkRows:
    """What every parsed piece says of its rows: how many, and which are good (`reason < 0`)."""

    labels: np.ndarray
    reason: np.ndarray
    ends_in_quote = False  # a quoted field left open at the end (spec_parse.SpecChunk's)

    @property
    def rows(self) -> int:
        return len(self.labels)

    @property
    def ok(self) -> np.ndarray:
        return self.reason < 0


@dataclass
class ParsedChunk(ChunkRows):
    """Every row of a chunk, decoded; rows with `reason >= 0` are malformed (see REASONS)."""

    labels: np.ndarray  # uint8 [rows]
    dense: np.ndarray  # int64 [rows, num_dense], 0 where missing
    dense_missing: np.ndarray  # bool [rows, num_dense]
    sparse: np.ndarray  # uint64 [rows, num_sparse], 0 where missing
    sparse_missing: np.ndarray  # bool [rows, num_sparse]
    reason: np.ndarray  # int8 [rows], -1 for a good row, else an index into REASONS
    bad_field: np.ndarray  # int16 [rows], field index of the first bad field (-1 if none)
    row_start: np.ndarray = field(repr=False)  # int64 [rows] byte offset of each row, for messages
    row_end: np.ndarray = field(repr=False)  # int64 [rows] offset of each row's newline


def _separator_positions(buf: np.ndarray, delim: int) -> np.ndarray:
    if delim < NEWLINE:
        # One compare instead of two; other control bytes <= 10 are rare and dropped after.
        pos = np.flatnonzero(buf <= NEWLINE)
        b = buf[pos]
        if not ((b == delim) | (b == NEWLINE)).all():
            pos = pos[(b == delim) | (b == NEWLINE)]
        return pos
    return np.flatnonzero((buf == delim) | (buf == NEWLINE))


def _field_ranges(
    buf: np.ndarray, delim: int, nfields: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """[rows, nfields] start/end byte offsets, fields counted per row, row byte lengths."""
    pos = _separator_positions(buf, delim)
    nl_idx = np.flatnonzero(buf[pos] == NEWLINE)  # index into pos of each row's newline
    rows = len(nl_idx)
    first = np.empty(rows, dtype=np.int64)  # index into pos of each row's first separator
    first[0:1] = 0
    first[1:] = nl_idx[:-1] + 1
    counted = nl_idx - first + 1
    nl_pos = pos[nl_idx]
    # Field k ends at the row's k-th separator; past the row's last field the index is
    # clipped to the newline, so padded fields are empty at the row's end: right-padding,
    # never shifting, with no per-row work.
    end = pos[np.minimum(first[:, None] + np.arange(nfields), nl_idx[:, None])]
    start = np.empty_like(end)
    start[:, 0] = 0
    start[1:, 0] = nl_pos[:-1] + 1
    np.minimum(end[:, :-1] + 1, end[:, 1:], out=start[:, 1:])
    # A '\r' before the newline belongs to no field (files written on Windows).
    if (
        buf[nl_pos[0] - 1 if nl_pos[0] > 0 else 0] == CR
        or (buf[np.maximum(nl_pos - 1, 0)] == CR).any()
    ):
        last = np.minimum(counted, nfields) - 1
        r = np.arange(rows)
        cr = (
            (end[r, last] > start[r, last])
            & (buf[np.maximum(end[r, last] - 1, 0)] == CR)
            & (end[r, last] == nl_pos)
        )
        end[r[cr], last[cr]] -= 1
    return start, end, counted, nl_pos - start[:, 0]


def _first_true(mask: np.ndarray) -> np.ndarray:
    """Column index of the first True per row (-1 if none)."""
    if mask.shape[1] == 0:
        return np.full(mask.shape[0], -1, dtype=np.int64)
    return np.where(mask.any(axis=1), mask.argmax(axis=1), -1)


def parse_chunk(
    data: bytes | np.ndarray,
    schema: Schema = Schema(),
    engine: Literal["auto", "compiled", "numpy"] = "auto",
) -> ParsedChunk:
    """Parse whole lines of text. `data` must be empty or end with a newline.

    engine: "compiled" (numba, one pass), "numpy" (vectorized passes), or "auto" (compiled
    when numba is installed). Both give the same result.
    """
    buf = (
        np.frombuffer(data, dtype=np.uint8)
        if isinstance(data, (bytes, bytearray, memoryview))
        else data
    )
    if len(buf) and buf[-1] != NEWLINE:
        raise ValueError("parse_chunk needs text that ends with a newline")
    if len(buf) == 0:
        return _empty(schema)
    if engine == "compiled" or (engine == "auto" and parse_kernel.AVAILABLE):
        return _parse_compiled(buf, schema)
    return _parse_numpy(buf, schema)


def _parse_compiled(buf: np.ndarray, schema: Schema) -> ParsedChunk:
    if buf.flags.writeable:  # one compiled signature for bytes and bytearray input
        buf = buf.view()
        buf.flags.writeable = False
    rows = int(count_newlines(buf))
    nd, ns = schema.num_dense, schema.num_sparse
    out = ParsedChunk(
        np.empty(rows, np.uint8), np.empty((rows, nd), np.int64), np.empty((rows, nd), bool),
        np.empty((rows, ns), np.uint64), np.empty((rows, ns), bool), np.empty(rows, np.int8),
        np.empty(rows, np.int16), np.empty(rows, np.int64), np.empty(rows, np.int64),
    )  # fmt: skip
    dec, hexv = parse_kernel.value_tables(schema.delimiter)
    parse_kernel.parse_rows(
        buf, dec, hexv, nd, ns, schema.min_fields, out.labels, out.dense, out.dense_missing, out.sparse,
        out.sparse_missing, out.reason, out.bad_field, out.row_start, out.row_end,
    )  # fmt: skip
    return out


def _parse_numpy(buf: np.ndarray, schema: Schema) -> ParsedChunk:
    nf, nd = schema.num_fields, schema.num_dense
    start, end, counted, row_len = _field_ranges(buf, ord(schema.delimiter), nf)
    rows = len(counted)
    label_end = strip_point_zero(buf, start[:, 0], end[:, 0])
    label_byte = buf[np.minimum(start[:, 0], len(buf) - 1)]
    bad_label = (label_end - start[:, 0] != 1) | (
        (label_byte != ord("0")) & (label_byte != ord("1"))
    )
    pad = padded(buf)
    dense, bad_int = decode_int(buf, start[:, 1 : 1 + nd], end[:, 1 : 1 + nd], pad)
    sparse, bad_hex = decode_hex(buf, start[:, 1 + nd :], end[:, 1 + nd :], pad)
    dense_missing = end[:, 1 : 1 + nd] == start[:, 1 : 1 + nd]
    sparse_missing = end[:, 1 + nd :] == start[:, 1 + nd :]

    reason = np.full(rows, -1, dtype=np.int8)
    bad_field = np.full(rows, -1, dtype=np.int16)
    first_int, first_hex = _first_true(bad_int), _first_true(bad_hex)
    # Checked in reverse priority so that the first reason in REASONS wins.
    for code, mask, fidx in (
        (5, first_hex >= 0, first_hex + 1 + nd),
        (4, first_int >= 0, first_int + 1),
        (3, bad_label, 0),
        (2, counted < schema.min_fields, counted),
        (1, counted > nf, nf),
        (0, (row_len == 0) | ((row_len == 1) & (buf[np.maximum(start[:, 0], 0)] == CR)), -1),
    ):
        reason[mask] = code
        bad_field[mask] = fidx[mask] if isinstance(fidx, np.ndarray) else fidx
    labels = np.where(bad_label, 0, label_byte - ord("0")).astype(np.uint8)
    return ParsedChunk(
        labels,
        dense,
        dense_missing,
        sparse,
        sparse_missing,
        reason,
        bad_field,
        start[:, 0].copy(),
        start[:, 0] + row_len,
    )


def _empty(schema: Schema) -> ParsedChunk:
    nd, ns = schema.num_dense, schema.num_sparse
    return ParsedChunk(
        np.zeros(0, np.uint8),
        np.zeros((0, nd), np.int64),
        np.zeros((0, nd), bool),
        np.zeros((0, ns), np.uint64),
        np.zeros((0, ns), bool),
        np.zeros(0, np.int8),
        np.zeros(0, np.int16),
        np.zeros(0, np.int64),
        np.zeros(0, np.int64),
    )


SHOWN_CHARS = 80  # of an offending value in messages, markers and the summary


def show_value(value: bytes, limit: int = SHOWN_CHARS) -> str:
    """A field as error messages show it: its repr, cut to `limit` characters plus its length.

    A 10 MB field would otherwise give a 10 MB error line, summary table and task marker.
    """
    if len(value) <= limit:
        return repr(value.decode("utf-8", "replace"))
    return f"{value[:limit].decode('utf-8', 'replace')!r}... ({len(value):,} bytes)"


def csv_hint(line: bytes, schema: Schema, path: str = "FILE") -> str:
    """What preprocessing a row of commas read as Criteo's TSV needs: --csv where the commas cut it
    into Criteo's fields, else a spec of its own ("" where the row has no comma)."""
    if b"," not in line or schema.delimiter == ",":
        return ""
    fields = len(line.split(b","))
    if schema.min_fields <= fields <= schema.num_fields:
        return " (commas in the row: a CSV file? preprocess it with --csv)"
    return (
        f" (commas in the row: a CSV of {fields} fields, not Criteo's {schema.num_fields}? "
        f"`shardrec spec infer {path} --label COLUMN --out spec.toml` describes it; then "
        "preprocess --spec spec.toml)"
    )


def describe_bad_row(
    data: bytes,
    chunk: ParsedChunk,
    row: int,
    schema: Schema,
    hint: bool = True,
    path: str = "FILE",
    spec: bool = False,
) -> tuple[str, str]:
    """(field name, offending text) of a malformed row, for `file:line: field: value` messages;
    `hint`: with what preprocessing `path` needs (a CSV read as TSV: csv_hint); `spec`: the rows
    are a feature spec's of Criteo's shape, whose `[format] missing` would read a word such as
    `NA` (spec_values.missing_hint, as the spec parser's messages say)."""
    code, fidx = int(chunk.reason[row]), int(chunk.bad_field[row])
    line = bytes(data[int(chunk.row_start[row]) : int(chunk.row_end[row])])
    line = line[:-1] if line.endswith(b"\r") else line
    if REASONS[code] == "empty_row":
        return "row", "(empty line)"
    fields = line.split(schema.delimiter.encode())
    if REASONS[code] == "too_many_fields":
        return "row", f"{len(fields)} fields, schema has {schema.num_fields}"
    if REASONS[code] == "too_few_fields":
        shown = csv_hint(line, schema, path) if hint and len(fields) == 1 else ""
        return (
            "row",
            f"{len(fields)} fields, schema needs at least {schema.min_fields} of {schema.num_fields}{shown}",
        )
    value = fields[fidx] if fidx < len(fields) else b""
    said = missing_hint(value.decode("utf-8", "replace"), REASONS[code], ()) if spec else ""
    return schema.field_names[fidx], show_value(value) + said


DENSE_TRANSFORMS = ("log1p", "signed-log1p", "shift-log1p", "none")


def transform_dense(
    values: np.ndarray, missing: np.ndarray, how: str = "log1p", dtype: str = "float32"
) -> np.ndarray:
    """Dense integers -> model inputs; defined for every int64 value, never NaN or -inf.

    - log1p (default, as the DLRM reference): missing -> 0; negatives clamped to 0; log(1 + x).
    - signed-log1p: sign(x) * log(1 + |x|); missing -> 0. Keeps I2's -1/-2/-3 apart.
    - shift-log1p: log(1 + x + 3) for x >= -3, values below -3 clamped to -3; missing -> 0.
    - none: the integer as a float; missing -> 0.
    """
    x = np.where(missing, 0, values).astype(np.float64)
    if how == "log1p":
        out = np.log1p(np.maximum(x, 0.0))
    elif how == "signed-log1p":
        out = np.sign(x) * np.log1p(np.abs(x))
    elif how == "shift-log1p":
        out = np.where(missing, 0.0, np.log1p(np.maximum(x, -3.0) + 3.0))
    elif how == "none":
        out = x
    else:
        raise ValueError(f"dense transform {how!r} is not one of {', '.join(DENSE_TRANSFORMS)}")
    with np.errstate(over="ignore"):  # a value past the dtype's range: the caller names it
        return out.astype(dtype)
