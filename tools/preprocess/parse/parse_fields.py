"""Decoding decimal and hex fields from their byte ranges in a text buffer, vectorized.

Two paths give the same answers:
- generic: right-aligned characters, lookup tables that both decode and validate, Horner's
  rule column by column; any width up to MAX_INT_DIGITS / MAX_HEX_DIGITS;
- fast (SWAR): the 8 bytes ending at a field are loaded as one little-endian uint64 from an
  unaligned view of the buffer and decoded with bit arithmetic on all fields at once.
  It covers decimal fields of 1-8 digits and hex fields of exactly 8 characters (all of
  Criteo's categoricals); the rare other fields go through the generic path.
"""

from __future__ import annotations

import numpy as np

NEWLINE = 10
CR = 13
MAX_INT_DIGITS = 19  # int64 ids have up to 19 digits (Snowflake-style ids among them)
INT64_MAX = (1 << 63) - 1
"""The largest magnitude an integer field may have: +-(2^63 - 1); 2^63 itself is a raw-id table's
missing key (format/raw_ids.py), which no integer field may read as."""
MAX_ID_DIGITS = 20  # uint64 ids have up to 20 digits (ids that are themselves 64-bit hashes)
ID_RANGE = (-(1 << 63), (1 << 64) - 1)
"""The integers an integer categorical may be: those a Parquet int64 or uint64 column holds, each
kept as its 64 bits (-1 and 2^64 - 1 are one id, as they are across a file of each)."""
MAX_HEX_DIGITS = 16

# Lookup tables: byte -> digit value, -1 for "not a digit here".
_DEC = np.full(256, -1, dtype=np.int8)
_DEC[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
_HEX = np.full(256, -1, dtype=np.int8)
_HEX[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
_HEX[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16)
_HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)


def strip_point_zero(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """End offsets without a fraction of zeros (`260.0`, `260.00`: CSV writers give integers so),
    where a digit or sign is before the point: parse_kernel.whole_end's rule."""
    if not (buf == ord(".")).any():
        return end
    # Only fields ending in '0' are walked back, one byte a pass, while '0' remains.
    ends, starts = end.ravel(), start.ravel()
    at = np.flatnonzero((ends - starts >= 3) & (buf[np.maximum(ends - 1, 0)] == ord("0")))
    k, first = ends[at], starts[at]
    while len(at):
        more = (k > first) & (buf[np.maximum(k - 1, 0)] == ord("0"))
        if not more.any():
            break
        k = k - more
    point = (k < ends[at]) & (k - first >= 2) & (buf[np.maximum(k - 1, 0)] == ord("."))
    out = end.copy()
    out.ravel()[at[point]] = k[point] - 1
    return out


def decode_int_generic(
    buf: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Signed decimal fields -> (int64 values, bad mask); empty fields give 0 and are not bad, and
    neither are 19 digits within +-INT64_MAX (decoded in uint64: 19 digits never wrap it)."""
    length = end - start
    neg = (length > 0) & (buf[np.minimum(start, len(buf) - 1)] == ord("-"))
    digits = length - neg
    bad = (neg & (digits == 0)) | (digits > MAX_INT_DIGITS)
    width = int(min(digits.max(initial=0), MAX_INT_DIGITS))
    value = np.zeros(start.shape, dtype=np.uint64)
    for j in range(width):
        # Right-aligned: character j of `width` sits at end - width + j.
        inside = j >= width - digits
        d = _DEC[buf[np.clip(end - width + j, 0, len(buf) - 1)]]
        bad |= inside & (d < 0)
        value = value * np.uint64(10) + np.where(inside & (d >= 0), d, 0).astype(np.uint64)
    bad |= value > np.uint64(INT64_MAX)
    value = np.where(bad, np.uint64(0), value).astype(np.int64)
    value = np.where(neg, -value, value)
    return value, bad


def decode_hex_generic(
    buf: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
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


_H = np.uint64(0x8080808080808080)
_L = np.uint64(0x0101010101010101)
_ZEROS = np.uint64(0x3030303030303030)
_U8 = np.uint64(8)
PAD = 8


def padded(buf: np.ndarray) -> np.ndarray:
    """A copy of buf with PAD zero bytes on each side, so 8-byte loads never need clipping."""
    out = np.zeros(len(buf) + 2 * PAD, dtype=np.uint8)
    out[PAD : PAD + len(buf)] = buf
    return out


def _words(pad: np.ndarray, offset: int) -> np.ndarray:
    """word[i] = pad[offset + i : offset + i + 8] as a little-endian uint64 (unaligned,
    overlapping).

    With offset 0, word[e] holds the 8 text bytes *ending* at e; with offset PAD, word[s]
    holds the 8 bytes *starting* at s.
    """
    n = len(pad) - 2 * PAD + 1
    return np.ndarray((n,), dtype="<u8", buffer=pad, offset=offset, strides=(1,))


def _in_range(xh: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """High bit of each byte set where that byte lies in [lo, hi]; xh is the word with every
    high bit set (ASCII bytes only), so the subtractions never borrow across bytes."""
    return (xh - np.uint64(lo) * _L) & ~(xh - np.uint64(hi + 1) * _L) & _H


def _hex8(w: np.ndarray, ascii_only: bool) -> tuple[np.ndarray, np.ndarray]:
    """8 hex characters (first at the low byte) -> (uint64 value, ok)."""
    # Setting bit 5 folds 'A'-'F' onto 'a'-'f' and leaves '0'-'9' as they are.
    ok = (
        _in_range(w | _H, 0x30, 0x39) | _in_range(w | np.uint64(0xA0A0A0A0A0A0A0A0), 0x61, 0x66)
    ) == _H
    if not ascii_only:
        ok &= (w & _H) == 0
    n = (w & np.uint64(0x0F0F0F0F0F0F0F0F)) + ((w >> np.uint64(6)) & _L) * np.uint64(9)
    # Big-endian packing: the first character is the most significant nibble.
    n = ((n << np.uint64(4)) | (n >> _U8)) & np.uint64(0x00FF00FF00FF00FF)
    n = ((n << _U8) | (n >> np.uint64(16))) & np.uint64(0x0000FFFF0000FFFF)
    n = ((n << np.uint64(16)) | (n >> np.uint64(32))) & np.uint64(0xFFFFFFFF)
    return n, ok


def _dec8(w: np.ndarray, digits: np.ndarray, ascii_only: bool) -> tuple[np.ndarray, np.ndarray]:
    """The last `digits` (1-8) bytes of w are decimal digits, first at the lowest of them."""
    keep = ~np.uint64(0) << ((np.uint64(8) - digits.astype(np.uint64)) << np.uint64(3))
    x = (w & keep) | (_ZEROS & ~keep)
    ok = _in_range(x | _H, 0x30, 0x39) == _H
    if not ascii_only:
        ok &= (x & _H) == 0
    v = x - _ZEROS
    v = v * np.uint64(10) + (v >> _U8)
    m = np.uint64(0x000000FF000000FF)
    v = (
        (v & m) * np.uint64(100 + (1000000 << 32))
        + ((v >> np.uint64(16)) & m) * np.uint64(1 + (10000 << 32))
    ) >> np.uint64(32)
    return v.astype(np.int64), ok


def decode_int(
    buf: np.ndarray, start: np.ndarray, end: np.ndarray, pad: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Signed decimal fields (`260.0` accepted) -> (int64 values, bad mask); empty gives 0, not bad.

    `pad` is `padded(buf)` when the caller already has it.
    """
    pad = padded(buf) if pad is None else pad
    ascii_only = not (buf >= 0x80).any()
    end = strip_point_zero(buf, start, end)
    neg = buf[start] == ord("-")  # an empty field's start is its delimiter, never '-'
    digits = end - start - neg
    # Every field goes through the 8-byte path (cheaper than selecting); the few longer ones
    # are redone below. A lone '-' has 0 digits: clipped to 1, the '-' itself fails validation.
    v, ok = _dec8(_words(pad, 0)[end], np.clip(digits, 1, 8), ascii_only)
    value = np.where(neg, -v, v)
    empty = end == start
    value[empty] = 0
    bad = ~ok & ~empty
    slow = digits > 8
    if slow.any():
        value[slow], bad[slow] = decode_int_generic(buf, start[slow], end[slow])
    return value, bad


def decode_hex(
    buf: np.ndarray, start: np.ndarray, end: np.ndarray, pad: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Hex fields -> (uint64 values, bad mask); empty fields give 0 and are not bad."""
    pad = padded(buf) if pad is None else pad
    ascii_only = not (buf >= 0x80).any()
    length = end - start
    value, ok = _hex8(_words(pad, PAD)[start], ascii_only)
    empty = length == 0
    value[empty] = 0
    bad = ~ok & ~empty
    slow = (length != 8) & ~empty
    if slow.any():
        value[slow], bad[slow] = decode_hex_generic(buf, start[slow], end[slow])
    return value, bad
