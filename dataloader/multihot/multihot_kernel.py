"""Compiled (numba) multi-hot expansion: each sample's ids written straight into the batch.

numpy's version (IndexTables.expand) makes two passes over the one-hot ids (max and min, to
know whether to fold them), `np.take`s the table rows into an int32 temporary, then copies
that into the batch's int64 values. At MLPerf's table sizes (1-40 M rows, 0.75-23 GB of
tables) nearly every row read misses the caches and the TLB, and numpy waits on each one in
turn. The kernel here folds each id as it reads it, writes the row's ids cast to the
output's dtype in their final place, and asks for the row of the sample `ahead` positions
later before copying this one, so that many misses are in flight at once. It holds no GIL:
the loader's worker threads expand in parallel.
"""

from __future__ import annotations

import numpy as np

from shardrec.dataloader.util.jit import AVAILABLE, njit

if AVAILABLE:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic
else:

    def intrinsic(f):
        return f


PREFETCH_AHEAD = 32
"""Samples between a row's prefetch and its copy. Profiled on 1 M-row tables (DLRMv2's sizes,
batch 8192, loaded machine): 16 ahead 1,327-1,507 CPU-ns per sample, 32 1,160-1,318,
64 1,266, 128 1,289, none 2,490-3,060."""
CACHE_LINE = 64


@intrinsic
def _prefetch(typingctx, address):
    """Hint that the cache line at a raw address will be read soon (LLVM's prefetch: read,
    keep in all cache levels). A hint only: an address outside any mapping is not touched."""

    def codegen(context, builder, signature, args):
        fn = builder.module.declare_intrinsic(
            "llvm.prefetch",
            [cgutils.voidptr_t],
            ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t] + [ir.IntType(32)] * 3),
        )
        i32 = ir.IntType(32)
        builder.call(fn, [builder.inttoptr(args[0], cgutils.voidptr_t), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return types.void(types.int64), codegen


@njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def expand_rows(table, ids, out, ahead):
    """out[i * size + j] = table[ids[i] % rows, j] for a table [rows, size] (cast to out's dtype).

    `ahead`: samples between a row's prefetch and its copy (0: no prefetch).
    """
    rows, size = table.shape
    n = ids.shape[0]
    # The reference's `x % rows` (non-negative), dividing only for ids outside [0, rows),
    # which a dataset folded to the table's size never has.
    r = np.empty(n, np.int64)
    for i in range(n):
        x = np.int64(ids[i])
        if x < 0 or x >= rows:
            x = x % rows
            x += rows if x < 0 else 0
        r[i] = x
    base = table.ctypes.data
    stride = table.strides[0]
    last = size * table.itemsize - 1
    for i in range(min(ahead, n)):
        _prefetch_row(base + r[i] * stride, last)
    for i in range(n):
        if i + ahead < n:
            _prefetch_row(base + r[i + ahead] * stride, last)
        row = table[r[i]]
        o = i * size
        for j in range(size):
            out[o + j] = row[j]


@njit(inline="always", nogil=True, boundscheck=False)
def _prefetch_row(start, last):
    """Prefetch every cache line of the row of bytes start..start + last."""
    line = start & -CACHE_LINE
    while line <= start + last:
        _prefetch(line)
        line += CACHE_LINE
