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
MAX_INT_DIGITS = 18  # |value| < 10^18 fits int64 without overflow checks
MAX_HEX_DIGITS = 16

# Lookup tables: byte -> digit value, -1 for "not a digit here".
_DEC = np.full(256, -1, dtype=np.int8)
_DEC[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
_HEX = np.full(256, -1, dtype=np.int8)
_HEX[np.frombuffer(b"0123456789", np.uint8)] = np.arange(10)
_HEX[np.frombuffer(b"abcdef", np.uint8)] = np.arange(10, 16)
_HEX[np.frombuffer(b"ABCDEF", np.uint8)] = np.arange(10, 16)


def strip_point_zero(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """End offsets with a trailing '.0' removed (the CSV copy writes integers as `260.0`)."""
    if not (buf == ord(".")).any():
        return end
    length = end - start
    has = length >= 3
    e1 = np.maximum(end - 1, 0)
    e2 = np.maximum(end - 2, 0)
    has &= (buf[e1] == ord("0")) & (buf[e2] == ord("."))
    return np.where(has, end - 2, end)


def decode_int_generic(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Signed decimal fields -> (int64 values, bad mask); empty fields give 0 and are not bad."""
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


def decode_hex_generic(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def _words(buf: np.ndarray) -> np.ndarray:
    """word[i] = the 8 bytes buf[i:i+8] as a little-endian uint64 (an unaligned, overlapping view)."""
    n = max(len(buf) - 7, 0)
    return np.ndarray((n,), dtype="<u8", buffer=buf, offset=0, strides=(1,))


def _at_least(x: np.ndarray, lo: int) -> np.ndarray:
    """High bit of each byte set where that (ASCII) byte is >= lo; no borrow crosses bytes."""
    return ((x | _H) - np.uint64(lo) * _L) & _H


def _all_in(x: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Every byte of x in [lo, hi]."""
    return ((x & _H) == 0) & ((_at_least(x, lo) & ~_at_least(x, hi + 1)) == _H)


def _hex8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """8 hex characters (first at the low byte) -> (uint64 value, ok)."""
    lower = w | np.uint64(0x2020202020202020)
    ascii_ok = (w & _H) == 0
    digit = _at_least(w, 0x30) & ~_at_least(w, 0x3A)
    alpha = _at_least(lower, 0x61) & ~_at_least(lower, 0x67)
    ok = ascii_ok & ((digit | alpha) == _H)
    n = (w & np.uint64(0x0F0F0F0F0F0F0F0F)) + ((w >> np.uint64(6)) & _L) * np.uint64(9)
    m16 = np.uint64(0x000F000F000F000F)
    n = ((n & m16) << np.uint64(4)) | ((n >> _U8) & m16)
    m32 = np.uint64(0x000000FF000000FF)
    n = ((n & m32) << _U8) | ((n >> np.uint64(16)) & m32)
    n = ((n & np.uint64(0xFFFF)) << np.uint64(16)) | ((n >> np.uint64(32)) & np.uint64(0xFFFF))
    return n, ok


def _dec8(w: np.ndarray, digits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The last `digits` (1-8) bytes of w are decimal digits, first at the lowest of them."""
    keep = ~np.uint64(0) << ((np.uint64(8) - digits.astype(np.uint64)) * _U8)
    x = (w & keep) | (_ZEROS & ~keep)
    ok = _all_in(x, 0x30, 0x39)
    v = x - _ZEROS
    v = v * np.uint64(10) + (v >> _U8)
    m = np.uint64(0x000000FF000000FF)
    v = ((v & m) * np.uint64(100 + (1000000 << 32)) + ((v >> np.uint64(16)) & m) * np.uint64(1 + (10000 << 32))) >> np.uint64(32)
    return v.astype(np.int64), ok


def decode_int(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Signed decimal fields (`260.0` accepted) -> (int64 values, bad mask); empty gives 0, not bad."""
    end = strip_point_zero(buf, start, end)
    neg = buf[np.minimum(start, len(buf) - 1)] == ord("-")
    neg &= end > start
    digits = end - start - neg
    # Every field goes through the 8-byte path (cheaper than selecting); the few it cannot
    # decode (more than 8 digits, or too close to the buffer's start) are redone below.
    words = _words(buf)
    v, ok = _dec8(words[np.clip(end - 8, 0, len(words) - 1)], np.clip(digits, 1, 8))
    value = np.where(neg, -v, v)
    empty = end == start
    value[empty] = 0
    bad = ~ok & ~empty
    slow = ((digits > 8) | (end < 8) | (neg & (digits == 0))) & ~empty
    if slow.any():
        value[slow], bad[slow] = decode_int_generic(buf, start[slow], end[slow])
    return value, bad


def decode_hex(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hex fields -> (uint64 values, bad mask); empty fields give 0 and are not bad."""
    length = end - start
    words = _words(buf)
    value, ok = _hex8(words[np.minimum(start, len(words) - 1)])
    empty = length == 0
    value[empty] = 0
    bad = ~ok & ~empty
    slow = (length != 8) & ~empty
    if slow.any():
        value[slow], bad[slow] = decode_hex_generic(buf, start[slow], end[slow])
    return value, bad
