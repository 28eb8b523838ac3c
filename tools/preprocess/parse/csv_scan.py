"""Where fields and rows of CSV text end, compiled (numba): the field scanner the feature-spec
parser (spec_kernel) reads each field with, and the row ends that text is cut at (RowEnds).

A field is cut at the delimiter or the newline, eight bytes at a time; when the spec quotes, a
field that opens with `"` runs to its closing quote (RFC 4180: it may hold the delimiter, `""` is
one quote) and a line without its closing quote is reported, not read past.

A quoted field may hold a line break, and the lines after it up to the closing quote are no rows
of their own (spec_kernel reads each of them as a malformed row). A byte range cut after such a
line would start inside the field, and its task would read the field's later lines as rows, so
text is cut only where a row ends: after a newline that no open quote holds, found by reading the
lines as parse_spec_rows reads them.
"""

from __future__ import annotations

import numpy as np

from shardrec.dataloader.util.jit import njit
from shardrec.tools.preprocess.parse.parse_kernel import trailing_zeros


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def scan_field(buf, i, delim, quoting):
    """(start, end, next, escaped, bad_quote) of the field at i: its value is buf[start:end] and
    buf[next] is the delimiter or newline after it (a '\\r' before the newline is no value byte)."""
    if quoting and buf[i] == 34:
        j, escaped = i + 1, False
        while True:
            c = buf[j]
            if c == 10:  # no closing quote on this line
                return i + 1, j, j, escaped, True
            if c == 34:
                if buf[j + 1] != 34:
                    break
                escaped, j = True, j + 2
                continue
            j += 1
        end, j = j, j + 1
        if buf[j] == 13 and buf[j + 1] == 10:
            j += 1
        elif buf[j] != delim and buf[j] != 10:  # text after the closing quote
            while buf[j] != delim and buf[j] != 10:
                j += 1
            return i + 1, end, j, escaped, True
        return i + 1, end, j, escaped, False
    j = _field_end(buf, i, delim)
    end = j - 1 if (buf[j] == 10 and j > i and buf[j - 1] == 13) else j
    return i, end, j, False, False


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def line_end(buf, i):
    """(the newline at or after i, whether the line holds an odd number of quotes: then it closes
    the field an earlier line's quote opened; `""` inside it counts twice)."""
    odd = False
    while buf[i] != 10:
        odd ^= buf[i] == 34
        i += 1
    return i, odd


_L = np.uint64(0x0101010101010101)
_H = np.uint64(0x8080808080808080)
_NEWLINES = np.uint64(0x0A0A0A0A0A0A0A0A)


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _field_end(buf, i, delim):
    """The first delimiter or newline at or after i, eight bytes at a time (a zero byte of w ^ d
    is a match: the lowest byte flagged by (x - L) & ~x & H is exact, higher ones may not be)."""
    n, j = len(buf), i
    d = np.uint64(delim) * _L
    while j + 8 <= n:
        w = np.uint64(0)
        p = np.uint64(j)
        for t in range(8):  # one unaligned load (see parse_kernel.hex8_swar)
            w |= np.uint64(buf[p + np.uint64(t)]) << np.uint64(8 * t)
        x, y = w ^ d, w ^ _NEWLINES
        hit = ((x - _L) & ~x & _H) | ((y - _L) & ~y & _H)
        if hit:
            return j + (np.int64(trailing_zeros(hit)) >> 3)
        j += 8
    while buf[j] != delim and buf[j] != 10:
        j += 1
    return j


@njit(cache=True, nogil=True, boundscheck=False)
def _row_end(buf, start, target, stop, delim, inside):
    """(one past the newline ending the first row that ends at or past `target`, or -1 where no
    row of buf[start:stop] does; whether a quote is open at stop). buf[stop - 1] is a newline;
    `inside`: a quote is open at start."""
    i = start
    while i < stop:
        if inside:
            j, odd = line_end(buf, i)
            inside = not odd
        else:
            a = i
            while True:
                s, e, j, escaped, bad = scan_field(buf, a, delim, True)
                inside = bad and e == j  # its quote not closed at the newline
                if buf[j] == 10:
                    break
                a = j + 1
        i = j + 1
        if j >= target and not inside:
            return i, False
    return -1, inside


class RowEnds:
    """Finds where a row ends in text whose quoted fields may hold line breaks (picklable)."""

    def __init__(self, delimiter: str) -> None:
        self.delim = ord(delimiter)

    def find(
        self, data: np.ndarray, start: int, target: int, inside: bool = False
    ) -> tuple[int, int, bool]:
        """(one past the newline that ends the first row ending at or past `target`, -1 where
        none of data[start:] does; where the lines read end; whether a quote is open there).
        data: uint8 text, a row's start at `start` unless `inside` (a quote is open there); its
        lines are read up to the first row's end, else up to its last newline."""
        stop = _find(data, 10, start, len(data), last=True) + 1
        if stop <= start:
            return -1, start, inside
        if not inside:  # no quote before the first newline at or past target: the plain cut
            nl = _find(data, 10, max(start, target), stop)
            if _find(data, 34, start, nl if nl >= 0 else stop) < 0:
                return (nl + 1, nl + 1, False) if nl >= 0 else (-1, stop, False)
        cut, inside = _row_end(data, start, target, stop, self.delim, inside)
        return cut, (cut if cut >= 0 else stop), inside


_STEP = 1 << 20  # bytes compared at once: bounded temporaries on a range of any size


def _find(data: np.ndarray, byte: int, lo: int, hi: int, last: bool = False) -> int:
    """The first (last: the last) index of `byte` in data[lo:hi], or -1."""
    steps = range(lo, hi, _STEP)
    for at in reversed(steps) if last else steps:
        hits = np.flatnonzero(data[at : min(at + _STEP, hi)] == byte)
        if len(hits):
            return at + int(hits[-1] if last else hits[0])
    return -1
