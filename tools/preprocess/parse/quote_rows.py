"""Where rows of quoting CSV text end: a quoted field may hold a line break, and the lines after
it up to the closing quote are no rows of their own (spec_kernel reads each of them as a malformed
row). A byte range cut after such a line would start inside the field, and its task would read
the field's later lines as rows, so text is cut only where a row ends: after a newline that no
open quote holds, found by reading the lines as parse_spec_rows reads them.
"""

from __future__ import annotations

import numpy as np

from shardrec.dataloader.util.jit import njit
from shardrec.tools.preprocess.parse.spec_kernel import line_end, scan_field


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
