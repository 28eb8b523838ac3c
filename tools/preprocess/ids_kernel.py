"""Compiled (numba) vocabulary lookups: each row's value found in one pass, straight into the part's column.

Vocabulary.lookup (numpy) takes ~10 passes over a column (a binary search over the whole table per
value, clamps, gathers, casts); here each value costs a bucket bound and a binary search within
its bucket (Vocabulary.bucket_starts: ~BUCKET_VALUES values, two cache lines), with the same
ids as the result.
"""

from __future__ import annotations

import numpy as np

from shardrec.dataloader.jit import njit
from shardrec.tools.preprocess.ids import MISSING_ID, OOV_ID, Vocabulary


@njit(cache=True, nogil=True, boundscheck=False)
def _lookup_into(values, missing, rows, f, table, ids, starts, shift, out, offset):
    n = len(table)
    top = np.uint64(table[n - 1]) if n else np.uint64(0)  # unsigned: no float comparison with v
    for k in range(len(rows)):
        r = rows[k]
        if missing[r, f]:
            out[offset + k] = MISSING_ID
            continue
        v = values[r, f]
        if n == 0 or v > top:
            out[offset + k] = OOV_ID
            continue
        b = v >> shift
        lo, hi = np.int64(starts[b]), np.int64(starts[b + np.uint64(1)])
        while lo < hi:
            mid = (lo + hi) >> 1
            if table[mid] < v:
                lo = mid + 1
            else:
                hi = mid
        if lo < n and table[lo] == v:
            out[offset + k] = ids[lo]
        else:
            out[offset + k] = OOV_ID


def lookup_rows_into(
    vocab: Vocabulary, values: np.ndarray, missing: np.ndarray, rows: np.ndarray, f: int, out: np.ndarray, offset: int
) -> None:
    """out[offset + k] = the id of values[rows[k], f] (Vocabulary.lookup's), in out's dtype."""
    starts, shift = vocab.bucket_starts
    table, ids = np.asarray(vocab.sorted_values), np.asarray(vocab.ids)  # a memmap as a plain (read-only) array
    _lookup_into(values, missing, rows, f, table, ids, starts, np.uint64(shift), out, offset)
