"""Compiled (numba) kernels that fill and count a part's columns: ids hashed into them (a whole
matrix, or the kept rows of a piece straight into a part's id columns, list values too), a list
column's values gathered for its vocabulary, the default log1p transform of dense integers looked
up in its table, and ids counted for the planner's statistics. Whether the
compiled path is taken is parse_kernel.AVAILABLE's to say: the one switch that the callers read and
the tests flip."""

from __future__ import annotations

import numpy as np

from shardrec.dataloader.format.raw_ids import MISSING_KEY
from shardrec.dataloader.util.jit import njit
from shardrec.dataloader.util.splitmix import MIX_M1, MIX_M2, mix64_scalar

RAW_MISSING = np.uint64(MISSING_KEY)


@njit(cache=True, nogil=True, boundscheck=False)
def hash_matrix(values, missing, cardinalities):
    """ids[r, f] = 0 if missing else 1 + splitmix64(values[r, f]) % (cardinalities[f] - 1); a raw-id
    feature (cardinality 0) keeps its value, MISSING_KEY where missing.

    The same function as ids.hash_ids, over all columns in one pass.
    """
    rows, cols = values.shape
    out = np.empty((rows, cols), dtype=np.uint64)
    m1, m2 = MIX_M1, MIX_M2
    s30, s27, s31 = np.uint64(30), np.uint64(27), np.uint64(31)
    for r in range(rows):
        for f in range(cols):
            if cardinalities[f] == 0:
                out[r, f] = RAW_MISSING if missing[r, f] else values[r, f]
                continue
            if missing[r, f]:
                out[r, f] = 0
                continue
            z = values[r, f]
            z = (z ^ (z >> s30)) * m1
            z = (z ^ (z >> s27)) * m2
            z = z ^ (z >> s31)
            out[r, f] = np.uint64(1) + z % np.uint64(cardinalities[f] - 1)
    return out


@njit(cache=True, nogil=True, boundscheck=False)
def hash_rows_into(values, missing, rows, features, cardinalities, out, offset):
    """out[j, offset + k] = hash of values[rows[k], features[j]], as in hash_matrix (a raw-id
    feature, cardinality 0, keeps its value). Returns k * len(features) + j for the first k, j whose
    raw id is RAW_MISSING itself (a value no raw id may be: format.raw_ids), or -1.

    Writes the kept rows of a piece straight into a part's id columns (one row of `out` per
    feature, already in the column's dtype): no [rows, features] uint64 temporary, no
    per-column astype, no row gather.
    """
    m1, m2 = MIX_M1, MIX_M2
    s30, s27, s31 = np.uint64(30), np.uint64(27), np.uint64(31)
    one = np.uint64(1)
    bad = -1
    mods = np.empty(len(features), dtype=np.uint64)
    for j in range(len(features)):
        mods[j] = np.uint64(max(cardinalities[features[j]] - 1, 0))
    for k in range(len(rows)):
        r = rows[k]
        for j in range(len(features)):
            f = features[j]
            if cardinalities[f] == 0:
                if missing[r, f]:
                    out[j, offset + k] = RAW_MISSING
                else:
                    out[j, offset + k] = values[r, f]
                    if values[r, f] == RAW_MISSING and bad < 0:
                        bad = k * len(features) + j
                continue
            if missing[r, f]:
                out[j, offset + k] = 0
                continue
            z = values[r, f]
            z = (z ^ (z >> s30)) * m1
            z = (z ^ (z >> s27)) * m2
            z = z ^ (z >> s31)
            out[j, offset + k] = one + z % mods[j]
    return bad


@njit(cache=True, nogil=True, boundscheck=False)
def gather_from_table(dense, rows, table, out, past):
    """out[k] = table[max(dense[rows[k]], 0)] for the values the table holds: the default log1p
    transform of dense integers, looked up (table and out viewed as unsigned integers of the
    dense dtype's width, so one kernel copies float32 or float16 bits). Each value past the table
    is left for the caller, its flat index into out noted in `past`; returns how many there are."""
    size, nd, n = len(table), dense.shape[1], 0
    for k in range(len(rows)):
        r = rows[k]
        for f in range(nd):
            v = dense[r, f]
            if v < size:
                out[k, f] = table[v if v > 0 else 0]
            else:
                past[n] = k * nd + f
                n += 1
    return n


@njit(cache=True, nogil=True, boundscheck=False)
def count_ids(ids, counts):
    """counts[i] += occurrences of id i in ids, in place (np.bincount allocates a table-sized
    array per call). Returns the first id outside the table, or -1 when all are inside."""
    n = len(counts)
    for i in range(len(ids)):
        v = np.int64(ids[i])
        if v < 0 or v >= n:
            return v
        counts[v] += 1
    return -1


@njit(cache=True, nogil=True, boundscheck=False)
def hash_lists_into(lvalues, lstart, llen, c, rows, cardinality, out, offsets, base, at):
    """Hash list column c's values of the kept `rows` onto out[at:], and their row offsets onto
    offsets[base + 1 :]; returns the new end of out. Ids as hash_rows_into's (a
    raw-id column, cardinality 0, keeps its values)."""
    mod = np.uint64(max(cardinality - 1, 1))
    one = np.uint64(1)
    for k in range(len(rows)):
        r = rows[k]
        s = lstart[r, c]
        for t in range(llen[r, c]):
            v = lvalues[s + t]
            out[at] = v if cardinality == 0 else one + mix64_scalar(v) % mod
            at += 1
        offsets[base + k + 1] = at
    return at


@njit(cache=True, nogil=True, boundscheck=False)
def gather_lists(lvalues, lstart, llen, c, rows, out):
    """List column c's raw values of the kept rows, in row order (for vocabularies)."""
    at = 0
    for k in range(len(rows)):
        r = rows[k]
        for t in range(llen[r, c]):
            out[at] = lvalues[lstart[r, c] + t]
            at += 1
    return at
