"""A spec's dense columns written into a part, each by its transform, with the bytes that
criteo_text.transform_dense gives, in one compiled pass.

log1p is most of a dense column's cost, and the counts and codes of click logs (Avazu's,
MovieLens's) are small integers: transform_dense's own log1p of 0, 1, .. LOG1P_TABLE_SIZE - 1 is
kept as a table in the part's dtype, and a value whose log1p input is such an integer is looked
up (a negative signed-log1p flips the sign bit: the cast of -y is minus the cast of y; numpy's
sign of -0.0 is +0.0, so a zero stays +0.0). Every other value (a float, a large integer, a
`none` column's) goes through transform_dense itself.
"""

from __future__ import annotations

import numpy as np

from shardrec.dataloader.util.jit import AVAILABLE, njit
from shardrec.tools.preprocess.parse.criteo_text import DENSE_TRANSFORMS, transform_dense

LOG1P, SIGNED_LOG1P, SHIFT_LOG1P, NO_TRANSFORM = range(4)  # DENSE_TRANSFORMS' order


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def _table_bits(h, v, missing, table, sign, size):
    """(the bits of v under transform h, True) where its log1p input is an integer below `size`,
    else (table[0], False): transform_dense computes it."""
    neg = False
    if missing:  # v read, then zeroed: a select (reading it only where present was a branch)
        v = 0.0
    if h == LOG1P:
        y = v if v > 0.0 else 0.0  # np.maximum(v, 0.0): +0.0 for -0.0 too
    elif h == SIGNED_LOG1P:
        y, neg = abs(v), v < 0.0  # np.sign(+-0.0) is +0.0: a zero stays +0.0
    elif h == SHIFT_LOG1P:
        y = 0.0 if missing else (v if v > -3.0 else -3.0) + 3.0
    else:
        y = -1.0
    i = np.int64(y) if 0.0 <= y < size else np.int64(-1)
    if i >= 0 and np.float64(i) == y:
        return (table[i] ^ sign if neg else table[i]), True
    return table[0], False


@njit(cache=True, nogil=True, boundscheck=False)
def dense_from_table(dense, dmiss, rows, how, table, sign, out, misses):
    """out[k, d] = the bits of row rows[k]'s dense column d under transform how[d] (LOG1P ..):
    table[i] where the transform's log1p input is an integer i below len(table) (table: the bits
    of transform_dense's log1p of 0, 1, .. in the part's dtype; a negative signed-log1p flips the
    sign bit, as the cast of -y is minus the cast of y). Every other k is listed in misses[d] for
    transform_dense itself (`none` always is); returns each column's count of them.

    In the order the values lie in memory: a column at a time where `dense` is column-major (a
    Parquet row group's), a row at a time where it is row-major (text parsed by a spec). Row by
    row over a column-major row group took ~2x the CPU (measured on 131 K Criteo-shaped rows,
    13 columns: 11.9 against 4.2 ms), and column by column over a row-major piece ~1.6x."""
    nd = dense.shape[1]
    counts = np.zeros(nd, np.int64)
    size = np.float64(len(table))
    if dense.strides[0] <= dense.strides[1]:
        for d in range(nd):
            h, c = how[d], 0
            for k in range(len(rows)):
                r = rows[k]
                bits, hit = _table_bits(h, dense[r, d], dmiss[r, d], table, sign, size)
                if hit:
                    out[k, d] = bits
                else:
                    misses[d, c] = k
                    c += 1
            counts[d] = c
        return counts
    for k in range(len(rows)):
        r = rows[k]
        for d in range(nd):
            bits, hit = _table_bits(how[d], dense[r, d], dmiss[r, d], table, sign, size)
            if hit:
                out[k, d] = bits
            else:
                misses[d, counts[d]] = k
                counts[d] += 1
    return counts


# Dense values whose log1p input is an integer below this are looked up (Criteo's, Avazu's and
# MovieLens's counts and codes mostly are); a table of 2^17 entries costs ~3 ms to build per process
# (512 KiB of float32: within the L2 cache of the cores we measured on).
LOG1P_TABLE_SIZE = 1 << 17
_LOG1P_TABLES: dict[str, tuple[np.ndarray, np.unsignedinteger]] = {}


def log1p_table(dense_dtype: str) -> tuple[np.ndarray, np.unsignedinteger]:
    """(bits of transform_dense's log1p of 0 .. LOG1P_TABLE_SIZE - 1 in dense_dtype, its sign bit):
    made by transform_dense itself, so a looked-up value has the bytes the function gives."""
    if dense_dtype not in _LOG1P_TABLES:
        x = np.arange(LOG1P_TABLE_SIZE, dtype=np.float64)
        values = transform_dense(x, np.zeros(len(x), bool), "log1p", dense_dtype)
        bits = np.dtype(f"uint{8 * values.itemsize}")
        _LOG1P_TABLES[dense_dtype] = values.view(bits), bits.type(1 << (8 * values.itemsize - 1))
    return _LOG1P_TABLES[dense_dtype]


def append_dense(
    out: np.ndarray,
    values: np.ndarray,
    missing: np.ndarray,
    rows: np.ndarray,
    transforms: list[str],
    dense_dtype: str,
) -> None:
    """out[k, d] = transform_dense of values[rows[k], d] (missing[rows[k], d]) by transforms[d],
    cast to dense_dtype (out's dtype): looked up where the log1p input is a small integer, by
    transform_dense itself for each column's other rows."""
    if not transforms:
        return
    if not AVAILABLE:  # the compiled lookup would run as Python
        for d, how in enumerate(transforms):
            out[:, d] = transform_dense(values[rows, d], missing[rows, d], how, dense_dtype)
        return
    table, sign = log1p_table(dense_dtype)
    how = np.array([DENSE_TRANSFORMS.index(t) for t in transforms], np.int8)
    misses = np.empty((len(transforms), len(rows)), np.int64)
    counts = dense_from_table(
        values, missing, rows, how, table, sign, out.view(table.dtype), misses
    )
    for d in np.flatnonzero(counts):
        r = rows[misses[d, : counts[d]]]
        out[misses[d, : counts[d]], d] = transform_dense(
            values[r, d], missing[r, d], transforms[d], dense_dtype
        )
