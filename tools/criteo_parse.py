"""A vectorized parser for Criteo-shaped click-log text: no per-row Python.

A chunk of bytes that ends at a newline is parsed in a fixed number of numpy passes:

1. the positions of every delimiter and newline are found at once (`flatnonzero`);
2. each position gets its row (a running count of newlines) and its field index within the
   row (its rank among the row's separators). Rows with fewer fields than the schema are
   right-padded with empty fields by construction, never shifted; rows with more are flagged;
3. each field's [start, end) byte range lands in a [rows, fields] matrix;
4. integer and hex fields are decoded column-wise with lookup tables and Horner's rule over
   right-aligned characters, and the same tables flag non-digit / non-hex characters.

Row rules (from the real Criteo files):
- a missing value is an empty field; its mask is returned next to the value;
- integers may be negative (I2 holds -1, -2, -3); `260.0` is accepted as 260 (the CSV copy);
- categoricals are hex, up to 16 characters, decoded as uint64 (8-char Criteo values keep all
  32 bits; nothing goes through float32, so ids above 2^24 are exact);
- a trailing '\\r' before the newline is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

NEWLINE = 10
CR = 13
MAX_INT_DIGITS = 18  # |value| < 10^18 fits int64 without overflow checks
MAX_HEX_DIGITS = 16

# Lookup tables: byte -> digit value, -1 for "not a digit here".
_DEC = np.full(256, -1, dtype=np.int8)
_DEC[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
_HEX = np.full(256, -1, dtype=np.int8)
_HEX[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
_HEX[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16)
_HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)

# Reasons a row is skipped, in the order they are checked (a row reports its first).
REASONS = ("empty_row", "too_many_fields", "bad_label", "bad_integer", "bad_hex")


@dataclass(frozen=True)
class Schema:
    """The shape of one text row: label, then dense integers, then hex categoricals."""

    num_dense: int = 13
    """Integer columns after the label."""
    num_sparse: int = 26
    """Hex categorical columns after the integers."""
    delimiter: str = "\t"
    """Field separator (one byte)."""
    header: bool = False
    """The first line of each file names the columns and is skipped."""

    def __post_init__(self) -> None:
        if len(self.delimiter.encode()) != 1 or self.delimiter == "\n":
            raise ValueError(f"delimiter {self.delimiter!r} must be one byte and not a newline")
        if self.num_dense < 0 or self.num_sparse < 0:
            raise ValueError(f"num_dense={self.num_dense}, num_sparse={self.num_sparse} must be >= 0")

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


@dataclass
class ParsedChunk:
    """Every row of a chunk, decoded; rows with `reason >= 0` are malformed (see REASONS)."""

    labels: np.ndarray  # uint8 [rows]
    dense: np.ndarray  # int64 [rows, num_dense], 0 where missing
    dense_missing: np.ndarray  # bool [rows, num_dense]
    sparse: np.ndarray  # uint64 [rows, num_sparse], 0 where missing
    sparse_missing: np.ndarray  # bool [rows, num_sparse]
    reason: np.ndarray  # int8 [rows], -1 for a good row, else an index into REASONS
    bad_field: np.ndarray  # int16 [rows], field index of the first bad field (-1 if none)
    field_start: np.ndarray = field(repr=False)  # int64 [rows, fields] byte ranges, for messages
    field_end: np.ndarray = field(repr=False)

    @property
    def rows(self) -> int:
        return len(self.labels)

    @property
    def ok(self) -> np.ndarray:
        return self.reason < 0


def _field_ranges(buf: np.ndarray, delim: int, nfields: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """[rows, nfields] start/end byte offsets, fields counted per row, row byte lengths."""
    pos = np.flatnonzero((buf == delim) | (buf == NEWLINE))
    is_nl = buf[pos] == NEWLINE
    nl_idx = np.flatnonzero(is_nl)  # index into pos of each row's newline
    rows = len(nl_idx)
    row_of = np.cumsum(is_nl) - is_nl  # the newline belongs to its own row
    first = np.empty(rows, dtype=np.int64)
    first[0:1] = 0
    first[1:] = nl_idx[:-1] + 1
    fidx = np.arange(len(pos)) - first[row_of]
    counted = fidx[nl_idx] + 1
    nl_pos = pos[nl_idx]
    row_start = np.empty(rows, dtype=np.int64)
    row_start[0:1] = 0
    row_start[1:] = nl_pos[:-1] + 1
    # Padded fields keep start == end (empty) at the row's newline: right-padding, never shifting.
    start = np.repeat(nl_pos[:, None], nfields, axis=1)
    end = start.copy()
    keep = fidx < nfields
    flat = row_of[keep] * nfields + fidx[keep]
    end.ravel()[flat] = pos[keep]
    nxt = keep & ~is_nl & (fidx + 1 < nfields)
    start.ravel()[row_of[nxt] * nfields + fidx[nxt] + 1] = pos[nxt] + 1
    start[:, 0] = row_start
    # A '\r' before the newline belongs to no field (files written on Windows).
    last = np.minimum(counted, nfields) - 1
    ends_last = end[np.arange(rows), last]
    cr = (ends_last > start[np.arange(rows), last]) & (buf[np.maximum(ends_last - 1, 0)] == CR)
    end[np.arange(rows)[cr], last[cr]] -= 1
    return start, end, counted, nl_pos - row_start


def _strip_point_zero(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """End offsets with a trailing '.0' removed (the CSV copy writes integers as `260.0`)."""
    length = end - start
    has = length >= 3
    e1 = np.maximum(end - 1, 0)
    e2 = np.maximum(end - 2, 0)
    has &= (buf[e1] == ord("0")) & (buf[e2] == ord("."))
    return np.where(has, end - 2, end)


def _decode_int(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Signed decimal fields -> (int64 values, bad mask); empty fields give 0 and are not bad."""
    end = _strip_point_zero(buf, start, end)
    length = end - start
    neg = (length > 0) & (buf[np.minimum(start, len(buf) - 1)] == ord("-"))
    digits = length - neg
    bad = (neg & (digits == 0)) | (digits > MAX_INT_DIGITS)
    width = int(min(digits.max(initial=0), MAX_INT_DIGITS))
    value = np.zeros(start.shape, dtype=np.int64)
    for j in range(width):
        # Right-aligned: character j of `width` sits at end - width + j.
        inside = j >= width - digits
        d = _DEC[buf[np.clip(end - width + j, 0, len(buf) - 1)]]
        bad |= inside & (d < 0)
        value = value * 10 + np.where(inside & (d >= 0), d, 0)
    value = np.where(neg, -value, value)
    return value, bad


def _decode_hex(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hex fields -> (uint64 values, bad mask); empty fields give 0 and are not bad."""
    length = end - start
    bad = length > MAX_HEX_DIGITS
    width = int(min(length.max(initial=0), MAX_HEX_DIGITS))
    value = np.zeros(start.shape, dtype=np.uint64)
    for j in range(width):
        inside = j >= width - length
        d = _HEX[buf[np.clip(end - width + j, 0, len(buf) - 1)]]
        bad |= inside & (d < 0)
        value = (value << np.uint64(4)) | np.where(inside & (d >= 0), d, 0).astype(np.uint64)
    return value, bad


def _first_true(mask: np.ndarray) -> np.ndarray:
    """Column index of the first True per row (-1 if none)."""
    if mask.shape[1] == 0:
        return np.full(mask.shape[0], -1, dtype=np.int64)
    return np.where(mask.any(axis=1), mask.argmax(axis=1), -1)


def parse_chunk(data: bytes | np.ndarray, schema: Schema = Schema()) -> ParsedChunk:
    """Parse whole lines of text. `data` must be empty or end with a newline."""
    buf = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) else data
    if len(buf) and buf[-1] != NEWLINE:
        raise ValueError("parse_chunk needs text that ends with a newline")
    nf, nd = schema.num_fields, schema.num_dense
    if len(buf) == 0:
        return _empty(schema)
    start, end, counted, row_len = _field_ranges(buf, ord(schema.delimiter), nf)
    rows = len(counted)
    label_end = _strip_point_zero(buf, start[:, 0], end[:, 0])
    label_byte = buf[np.minimum(start[:, 0], len(buf) - 1)]
    bad_label = (label_end - start[:, 0] != 1) | ((label_byte != ord("0")) & (label_byte != ord("1")))
    dense, bad_int = _decode_int(buf, start[:, 1 : 1 + nd], end[:, 1 : 1 + nd])
    sparse, bad_hex = _decode_hex(buf, start[:, 1 + nd :], end[:, 1 + nd :])
    dense_missing = end[:, 1 : 1 + nd] == start[:, 1 : 1 + nd]
    sparse_missing = end[:, 1 + nd :] == start[:, 1 + nd :]

    reason = np.full(rows, -1, dtype=np.int8)
    bad_field = np.full(rows, -1, dtype=np.int16)
    first_int, first_hex = _first_true(bad_int), _first_true(bad_hex)
    # Checked in reverse priority so that the first reason in REASONS wins.
    for code, mask, fidx in (
        (4, first_hex >= 0, first_hex + 1 + nd),
        (3, first_int >= 0, first_int + 1),
        (2, bad_label, 0),
        (1, counted > nf, nf),
        (0, (row_len == 0) | ((row_len == 1) & (buf[np.maximum(start[:, 0], 0)] == CR)), -1),
    ):
        reason[mask] = code
        bad_field[mask] = (fidx[mask] if isinstance(fidx, np.ndarray) else fidx)
    labels = np.where(bad_label, 0, label_byte - ord("0")).astype(np.uint8)
    return ParsedChunk(labels, dense, dense_missing, sparse, sparse_missing, reason, bad_field, start, end)


def _empty(schema: Schema) -> ParsedChunk:
    nd, ns, nf = schema.num_dense, schema.num_sparse, schema.num_fields
    return ParsedChunk(
        np.zeros(0, np.uint8),
        np.zeros((0, nd), np.int64),
        np.zeros((0, nd), bool),
        np.zeros((0, ns), np.uint64),
        np.zeros((0, ns), bool),
        np.zeros(0, np.int8),
        np.zeros(0, np.int16),
        np.zeros((0, nf), np.int64),
        np.zeros((0, nf), np.int64),
    )


def describe_bad_row(data: bytes, chunk: ParsedChunk, row: int, schema: Schema) -> tuple[str, str]:
    """(field name, offending text) of a malformed row, for `file:line: field: value` messages."""
    code, fidx = int(chunk.reason[row]), int(chunk.bad_field[row])
    if REASONS[code] == "empty_row":
        return "row", "(empty line)"
    if REASONS[code] == "too_many_fields":
        s = int(chunk.field_start[row, 0])
        line_end = data.find(b"\n", s)
        extra = data[s:line_end].count(schema.delimiter.encode()) + 1
        return "row", f"{extra} fields, schema has {schema.num_fields}"
    s, e = int(chunk.field_start[row, fidx]), int(chunk.field_end[row, fidx])
    return schema.field_names[fidx], repr(data[s:e].decode("utf-8", "replace"))


DENSE_TRANSFORMS = ("log1p", "signed-log1p", "shift-log1p", "none")


def transform_dense(values: np.ndarray, missing: np.ndarray, how: str = "log1p", dtype: str = "float32") -> np.ndarray:
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
    return out.astype(dtype)
