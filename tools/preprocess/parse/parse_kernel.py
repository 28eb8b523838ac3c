"""Compiled (numba) kernels of preprocessing's hot loops: the row parser (id hashing into the
part's columns and id counting: parts/column_kernels.py; newlines: text/lines.py).

The row parser is one pass over the bytes, with the same rules as the numpy parser.

numpy needs ~40 passes over each chunk's field matrices; a compiled loop touches each byte
once, which is what it takes to parse at disk speed on one core. criteo_text.parse_chunk uses this
kernel when numba imports and falls back to its numpy path otherwise; the unit tests hold
the two to identical results on random and malformed rows.

Row rules (shared with criteo_text.py): fields past the row's end are missing (right-padding),
but a row with fewer than `nmin` fields (Schema.min_fields) is malformed (too few fields);
a label is exactly `0` or `1`; integers are an optional '-' and 1-19 digits within
+-(2^63 - 1), with `260.0` and `260.00` accepted; categoricals are 1-16 hex digits; a '\\r'
before the newline is ignored.
A feature spec's integer categoricals (spec_kernel) are decode_id's: -2^63 to 2^64 - 1, as 64 bits.
"""

from __future__ import annotations

import numpy as np

from shardrec.dataloader.util.jit import AVAILABLE, njit
from shardrec.tools.preprocess.parse.parse_fields import (
    ID_RANGE,
    INT64_MAX,
    MAX_ID_DIGITS,
    MAX_INT_DIGITS,
)
from shardrec.tools.preprocess.text.lines import count_newlines

if AVAILABLE:
    from numba.cpython.unsafe.numbers import trailing_zeros
else:

    def trailing_zeros(x):
        return (int(x) & -int(x)).bit_length() - 1


# Codes as in parse.REASONS.
EMPTY_ROW, TOO_MANY_FIELDS, TOO_FEW_FIELDS, BAD_LABEL, BAD_INTEGER, BAD_HEX = 0, 1, 2, 3, 4, 5


@njit(cache=True, nogil=True, boundscheck=False)
def whole_end(buf, s, e):
    """The end of buf[s:e] without a fraction of zeros (`260.0`, `260.00`: CSV and Parquet
    writers give a whole number as many zeros as they like); e where there is none, or nothing
    before the point."""
    k = e
    while k > s and buf[k - 1] == 48:
        k -= 1
    return k - 1 if k < e and k - s >= 2 and buf[k - 1] == 46 else e


@njit(cache=True, nogil=True, boundscheck=False)
def decode_int(buf, s, e):
    """(value, ok) of buf[s:e], a non-empty field: up to MAX_INT_DIGITS digits within
    +-INT64_MAX, decoded in uint64 (19 digits never wrap it). `260.0` is read as 260; a longer
    fraction of zeros (`260.00`) is refused here and read by whole_int, which callers call where
    this refuses: whole_end's loop here, or that call, made this too long for LLVM to inline
    into the row loops, and the parse of a spec of 9-digit ids took 1.2-1.9x the CPU."""
    if e - s >= 3 and buf[e - 1] == 48 and buf[e - 2] == 46:  # trailing ".0"
        e -= 2
    neg = buf[s] == 45
    if neg:
        s += 1
    if e - s < 1 or e - s > MAX_INT_DIGITS:
        return 0, False
    v = np.uint64(0)
    for i in range(s, e):
        d = np.int64(buf[i]) - 48
        if d < 0 or d > 9:
            return 0, False
        v = v * np.uint64(10) + np.uint64(d)
    if v > np.uint64(INT64_MAX):
        return 0, False
    w = np.int64(v)
    return (-w if neg else w), True


@njit(cache=True, nogil=True, boundscheck=False)
def whole_int(buf, s, e):
    """(value, ok) of a field decode_int refused, read without a fraction of zeros (`260.00`):
    the integer a CSV or Parquet writer meant, as decode_int bounds it."""
    k = whole_end(buf, s, e)
    for i in range(s, k):  # one point at most: `1.0.0` is no number (decode_id would cut `.0`)
        if buf[i] == 46:
            return 0, False
    if k == e:
        return 0, False
    v, ok = decode_id(buf, s, k)  # within int64 where its sign is the text's
    return v, ok and ((v <= 0 and v != -INT64_MAX - 1) if buf[s] == 45 else v >= 0)


_ID_TENTH = np.uint64(ID_RANGE[1] // 10)  # 20 digits whose first 19 are past it pass 2^64 - 1
_NEG_ID = np.uint64(-ID_RANGE[0])


@njit(cache=True, nogil=True, boundscheck=False)
def decode_id(buf, s, e):
    """(value, ok) of the integer id buf[s:e], a non-empty field: an optional '-' and up to
    MAX_ID_DIGITS digits within ID_RANGE (`260.0`, `260.00` accepted); the value is the id's 64 bits in an
    int64 (2^64 - 1 as -1), the bits a Parquet int64 or uint64 column of the same value holds.

    Shaped as decode_int, one loop and the tests after it, and as fast: a test inside the loop, a
    loop of its own for the 20th digit or a uint64 result took ~40% longer on 8 digits."""
    e = whole_end(buf, s, e)  # here the loop costs nothing measurable: ids past int64 are rare
    neg = buf[s] == 45
    if neg:
        s += 1
    n = e - s
    if n < 1 or n > MAX_ID_DIGITS:
        return 0, False
    v = np.uint64(0)
    head = v  # the value before the last digit: 19 digits never wrap uint64
    for i in range(s, e):
        d = np.int64(buf[i]) - 48
        if d < 0 or d > 9:
            return 0, False
        head = v
        v = v * np.uint64(10) + np.uint64(d)
    # Past 2^64 - 1: 10 x head wrapped, or head is _ID_TENTH and the last digit 6-9 wrapped to 0-3.
    if n == MAX_ID_DIGITS and (head > _ID_TENTH or (head == _ID_TENTH and v < np.uint64(10))):
        return 0, False
    if neg and v > _NEG_ID:
        return 0, False
    w = np.int64(v)
    return (-w if neg else w), True  # -(-2^63) wraps to itself: the bits of -2^63


@njit(cache=True, nogil=True, boundscheck=False)
def decode_hex(buf, s, e):
    if e - s > 16:
        return np.uint64(0), False
    v = np.uint64(0)
    for i in range(s, e):
        c = buf[i]
        if 48 <= c <= 57:
            d = c - 48
        elif 97 <= c <= 102:
            d = c - 87
        elif 65 <= c <= 70:
            d = c - 55
        else:
            return np.uint64(0), False
        v = (v << np.uint64(4)) | np.uint64(d)
    return v, True


END, OTHER, POINT = -2, -1, -3


def value_tables(delimiter: str) -> tuple[np.ndarray, np.ndarray]:
    """byte -> digit value for decimal and hex fields; END for the delimiter and newline,
    POINT for '.', OTHER for anything else (invalid in a field)."""
    dec = np.full(256, OTHER, dtype=np.int8)
    hexv = np.full(256, OTHER, dtype=np.int8)
    dec[48:58] = np.arange(10)
    hexv[48:58] = np.arange(10)
    hexv[97:103] = np.arange(10, 16)
    hexv[65:71] = np.arange(10, 16)
    dec[46] = POINT
    for t in (dec, hexv):
        t[ord(delimiter)] = END
        t[10] = END
    return dec, hexv


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _field_end(buf, s, table):
    j = s
    while table[buf[j]] != END:
        j += 1
    return j


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _scan_int(buf, s, dec):
    """One pass that finds the field's end and decodes it: (value, ok, end)."""
    neg = buf[s] == 45
    j = s + 1 if neg else s
    v, ok = 0, True
    while True:
        d = dec[buf[j]]
        if d < 0:
            break
        v = v * 10 + d
        j += 1
    if d == END and j - s - neg <= 18 and j - s > neg and not (buf[j] == 10 and buf[j - 1] == 13):
        return (-v if neg else v), True, j
    # Rare: a fraction of zeros, a '\r' before the newline, bad or too many digits.
    e = _field_end(buf, j, dec)
    end = e - 1 if (buf[e] == 10 and e > s and buf[e - 1] == 13) else e
    v, ok = decode_int(buf, s, end)
    if not ok:
        v, ok = whole_int(buf, s, end)
    return v, ok, e


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _scan_hex(buf, s, hexv):
    j = s
    v = np.uint64(0)
    while True:
        d = hexv[buf[j]]
        if d < 0:
            break
        v = (v << np.uint64(4)) | np.uint64(d)
        j += 1
    if d == END and j - s <= 16 and not (buf[j] == 10 and buf[j - 1] == 13):
        return v, True, j
    e = _field_end(buf, j, hexv)
    end = e - 1 if (buf[e] == 10 and e > s and buf[e - 1] == 13) else e
    v, ok = decode_hex(buf, s, end)
    return v, ok, e


_H = np.uint64(0x8080808080808080)
_L = np.uint64(0x0101010101010101)
_LOWER = np.uint64(0xA0A0A0A0A0A0A0A0)
_NIB = np.uint64(0x0F0F0F0F0F0F0F0F)
_M16 = np.uint64(0x00FF00FF00FF00FF)
_M32 = np.uint64(0x0000FFFF0000FFFF)
_M64 = np.uint64(0xFFFFFFFF)
_U = (
    np.uint64(0),
    np.uint64(4),
    np.uint64(6),
    np.uint64(8),
    np.uint64(16),
    np.uint64(32),
    np.uint64(9),
)


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def hex8_swar(buf, s):
    """(value, ok) of the 8 hex characters at buf[s:s+8], decoded as one 64-bit word."""
    w = np.uint64(0)
    p = np.uint64(s)  # an unsigned index has no negative-index fix-up, so LLVM can fold
    for k in range(8):  # these eight byte loads into one unaligned 64-bit load
        w |= np.uint64(buf[p + np.uint64(k)]) << np.uint64(8 * k)
    xh, yh = w | _H, w | _LOWER
    digit = (xh - np.uint64(0x30) * _L) & ~(xh - np.uint64(0x3A) * _L)
    alpha = (yh - np.uint64(0x61) * _L) & ~(yh - np.uint64(0x67) * _L)
    ok = (w & _H) == _U[0] and ((digit | alpha) & _H) == _H
    n = (w & _NIB) + ((w >> _U[2]) & _L) * _U[6]
    n = ((n << _U[1]) | (n >> _U[3])) & _M16
    n = ((n << _U[3]) | (n >> _U[4])) & _M32
    n = ((n << _U[4]) | (n >> _U[5])) & _M64
    return n, ok


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def int_swar(buf, s):
    """(value, digits) of the decimal digits that start the 8 bytes at buf[s:s+8], decoded as one
    64-bit word; digits is 8 when all eight are digits (the caller then takes the scan loop)."""
    w = np.uint64(0)
    p = np.uint64(s)
    for k in range(8):  # one unaligned load (see hex8_swar)
        w |= np.uint64(buf[p + np.uint64(k)]) << np.uint64(8 * k)
    xh = w | _H
    digit = (xh - np.uint64(0x30) * _L) & ~(xh - np.uint64(0x3A) * _L) & ~w & _H
    other = ~digit & _H
    if other == _U[0]:
        return 0, 8
    n = np.int64(trailing_zeros(other)) >> 3
    if n == 0:
        return 0, 0
    # The n digits moved to the top bytes (zeros above act as leading zeros), then combined
    # pairwise: 2 digits per 16 bits, 4 per 32, 8 per 64.
    v = (w & _NIB) << np.uint64(8 * (8 - n))
    v = (v * np.uint64(10) + (v >> _U[3])) & _M16
    v = (v * np.uint64(100) + (v >> _U[4])) & _M32
    v = (v * np.uint64(10000) + (v >> _U[5])) & _M64
    return np.int64(v), n


@njit(cache=True, nogil=True, boundscheck=False)
def parse_rows(
    buf,
    dec,
    hexv,
    nd,
    ns,
    nmin,
    labels,
    dense,
    dmiss,
    sparse,
    smiss,
    reason,
    bad_field,
    row_start,
    row_end,
):
    """Fill the per-row arrays (sized to the number of newlines in buf); returns rows parsed.

    nmin: fewest fields a row may have (Schema.min_fields); shorter rows are TOO_FEW_FIELDS.
    """
    n, nf, row, i = len(buf), 1 + nd + ns, 0, 0
    while i < n:
        row_start[row] = i
        j = _field_end(buf, i, dec)
        e = j - 1 if (buf[j] == 10 and j > i and buf[j - 1] == 13) else j
        ee = whole_end(buf, i, e) if e - i >= 3 else e  # `1.0`, `1.00`
        label_bad = not (ee - i == 1 and (buf[i] == 48 or buf[i] == 49))
        labels[row] = 0 if label_bad else buf[i] - 48
        f, first_int, first_hex, ur = 1, -1, -1, np.uint64(row)
        while buf[j] != 10 and f < nf:
            s = j + 1
            if f <= nd:
                c = np.uint64(f - 1)  # unsigned indices: no negative-index fix-ups in the stores
                if dec[buf[s]] == END or (buf[s] == 13 and buf[s + 1] == 10):
                    dense[ur, c], dmiss[ur, c], j = 0, True, _field_end(buf, s, dec)
                else:
                    v, m = int_swar(buf, s) if s + 8 <= n else (0, 0)
                    if 0 < m < 8 and dec[buf[s + m]] == END:  # 1-7 digits, then the field's end
                        ok, j = True, s + m
                    else:  # a sign, 8+ digits, '.0', '\r', a bad byte, or the buffer's last bytes
                        v, ok, j = _scan_int(buf, s, dec)
                    dense[ur, c], dmiss[ur, c] = v, False
                    if not ok and first_int < 0:
                        first_int = f
            else:
                k = np.uint64(f - 1 - nd)
                if hexv[buf[s]] == END or (buf[s] == 13 and buf[s + 1] == 10):
                    sparse[ur, k], smiss[ur, k], j = np.uint64(0), True, _field_end(buf, s, hexv)
                else:
                    ok = False
                    if s + 8 < n and hexv[buf[s + 8]] == END:  # Criteo's 8-character ids
                        h, ok = hex8_swar(buf, s)
                        j = s + 8
                    if not ok:
                        h, ok, j = _scan_hex(buf, s, hexv)
                    sparse[ur, k], smiss[ur, k] = h, False
                    if not ok and first_hex < 0:
                        first_hex = f
            f += 1
        for g in range(f, nf):  # right-padding: stripped trailing fields are missing
            if g <= nd:
                dense[row, g - 1], dmiss[row, g - 1] = 0, True
            else:
                sparse[row, g - 1 - nd], smiss[row, g - 1 - nd] = np.uint64(0), True
        too_many = buf[j] != 10
        while buf[j] != 10:
            j += 1
        row_end[row] = j
        empty = j == i or (j - i == 1 and buf[i] == 13)
        # f counts the row's fields when it has fewer than nf (the loop stopped at its newline).
        reason[row], bad_field[row] = _row_reason(
            empty, too_many, f < nmin, f, label_bad, first_int, first_hex, nf
        )
        row += 1
        i = j + 1
    return row


@njit(cache=True, nogil=True, inline="always")
def _row_reason(empty, too_many, too_few, fields, label_bad, first_int, first_hex, nf):
    """(reason code, first bad field) of a row; (-1, -1) for a good one. Order as in REASONS."""
    if empty:
        return EMPTY_ROW, -1
    if too_many:
        return TOO_MANY_FIELDS, nf
    if too_few:
        return TOO_FEW_FIELDS, fields
    if label_bad:
        return BAD_LABEL, 0
    if first_int >= 0:
        return BAD_INTEGER, first_int
    if first_hex >= 0:
        return BAD_HEX, first_hex
    return -1, -1


def warm_up() -> None:
    """Load a kernel from numba's cache: the first load of a process sets up numba's code generator
    (a fraction of a CPU-second), which cpu_stages then counts as start-up rather than as the stage
    that calls a kernel first."""
    if AVAILABLE:
        buf = np.zeros(1, np.uint8)
        buf.flags.writeable = False  # the signature the parser and the planner call it with
        count_newlines(buf)
