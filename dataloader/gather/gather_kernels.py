"""Compiled (numba) gathers for the shuffled loader: each value read once and written in place.

numpy's version of a shuffled column gather is `np.take` into a temporary in the column's
own dtype, then a second pass that casts it into the batch's int64 (or float32) array. The
kernels here read each row once and write the cast value straight to its final place: for
the sparse ids, the bulk of a Criteo-shaped batch, that is faster than numpy's two passes.
Dense rows are copied whole, one memcpy a row (`copy_rows`): faster than `np.take(axis=0)` and
than a compiled loop over 13 values.

Rows of several parts (a shuffle window mixes blocks of every part) are where numpy does
worst: it groups the rows by part, gathers each group, then scatters it into place, one
pass per part and column. `locate_keys` finds each row's part once (its slot among the held
parts and its row there, one key), and the `*_parts` kernels read every column in one in-order
pass, from each part's map by data address and stride (one part stays faster still, as each
row's part is read back for every column; `shardrec bench loader` measures both).

`take_values`/`take_rows` with `where` and `group_by_part` serve what still goes part by
part (multi-hot features): `where` None means output position k gets row idx[k], else
position where[k] does; numba compiles the two cases apart.

Consecutive rows (no shuffle) are slice copies, one per part they lie in, except the ids:
`copy_ids` casts them to int64 and takes their max for the bounds check in one vectorized pass,
faster than numpy's cast alone. Every id kernel returns the largest id it read: a running max
beside the memory traffic, so the loader's bounds check (batch.py) costs nothing measurable.

batch.py uses these kernels when numba imports and its numpy path otherwise; the unit tests
hold the two to identical batches.
"""

from __future__ import annotations

import numpy as np

from shardrec.dataloader.util.jit import AVAILABLE, njit

if AVAILABLE:
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic
else:

    def intrinsic(f):
        return f


@intrinsic
def _load(typingctx, address, like):
    """The value of like's dtype at a raw address: one column spread over several parts' maps.

    numba has no fast container of arrays (a typed List costs far more per element), so the
    kernels for rows of several parts take each part's data address and stride instead.
    The caller keeps the arrays alive and the indices valid.
    """
    dtype = like.dtype

    def codegen(context, builder, signature, args):
        return builder.load(builder.inttoptr(args[0], context.get_data_type(dtype).as_pointer()))

    return dtype(types.int64, like), codegen


@intrinsic
def _copy_bytes(typingctx, destination, source, nbytes):
    """memcpy(destination, source, nbytes) between raw addresses (the caller keeps both valid)."""

    def codegen(context, builder, signature, args):
        to, start = (builder.inttoptr(a, cgutils.voidptr_t) for a in args[:2])
        cgutils.raw_memcpy(builder, to, start, args[2], 1)
        return context.get_dummy_value()

    return types.void(types.int64, types.int64, types.int64), codegen


@njit(cache=True, nogil=True, boundscheck=False)
def take_values(src, idx, where, out):
    """out[pos] = src[idx[k]] for a 1-d column (cast to out's dtype on assignment); indices are
    read as unsigned (they are rows, never negative: see `_take_into`)."""
    if where is None:
        for k in range(idx.shape[0]):
            out[k] = src[np.uint64(idx[k])]
    else:
        for k in range(idx.shape[0]):
            out[np.uint64(where[k])] = src[np.uint64(idx[k])]


@njit(cache=True, nogil=True, boundscheck=False)
def take_rows(src, idx, where, out):
    """out[where[k], :] = src[idx[k], :] for a 2-d column (dense rows of one of several parts).

    Rows of a single part go through `np.take(axis=0)` instead: its row copies beat this loop.
    """
    width = src.shape[1]
    for k in range(idx.shape[0]):
        r, pos = idx[k], where[k]
        for j in range(width):
            out[pos, j] = src[r, j]


@njit(cache=True, nogil=True, boundscheck=False)
def copy_rows(src, idx, out):
    """out[k, :] = src[idx[k], :] for a 2-d column of one part whose rows are stored contiguously,
    as out's are (the caller checks it): one memcpy per row, a dense row of Criteo's 13 float32.

    ~2.4x `np.take(axis=0, out=...)` on a shuffle window's 64 K rows of a 450 K-row part in cache
    (167 vs 400 us: numpy's take pays its own per-row overhead around the same copies); ~1.25x
    in the loader, where the rows are read cold."""
    row = out.shape[1] * out.itemsize
    stride = src.strides[0]
    start, base = src.ctypes.data, out.ctypes.data
    for k in range(idx.shape[0]):
        _copy_bytes(base + k * row, start + idx[k] * stride, row)


@njit(inline="always", nogil=True, boundscheck=False)
def _take_into(src, idx, dst, modulo, hi):
    """dst[j] = src[idx[j]] as int64, folded by modulo if > 0; the running max `hi` (uint64, a
    negative id as huge) of the ids read. Two loops, so that LLVM compiles each without a branch.

    The row index is read as unsigned: a signed one is wrapped (a negative index counts from the
    end), two more instructions between the index's load and the id's, on the path of every
    load; without them 15-25% less CPU for a shuffle window's ids (64 K rows of Criteo's 26 columns
    from a 2 M-row part, Intel Xeon). Rows are never negative."""
    if modulo > 0:
        for j in range(dst.shape[0]):
            v = np.int64(src[np.uint64(idx[j])])
            hi = max(hi, np.uint64(v))
            dst[j] = v % modulo
    else:
        for j in range(dst.shape[0]):
            v = np.int64(src[np.uint64(idx[j])])
            hi = max(hi, np.uint64(v))
            dst[j] = v
    return hi


@njit(cache=True, nogil=True, boundscheck=False)
def take_ids(src, idx, out, feature, modulo, pos):
    """Ids of one one-hot feature into out[batch, feature, row] as int64 (folded by modulo if > 0),
    src[idx[k]] at gather position pos + k.

    out is [batches, features, batch_size]: gather position p is row p % batch_size of batch
    p // batch_size, and each batch's ids are feature-major, as a KeyedJaggedTensor wants them.
    Returns the largest id read, unfolded, as uint64 (a negative id counts as huge) for the
    caller's bounds check: a running max is free beside the gather's memory traffic.
    """
    b = out.shape[2]
    hi = np.uint64(0)
    done, n = 0, idx.shape[0]
    while done < n:
        i, j0 = (pos + done) // b, (pos + done) % b
        m = min(b - j0, n - done)
        hi = _take_into(src, idx[done : done + m], out[i, feature, j0 : j0 + m], modulo, hi)
        done += m
    return hi


@njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def copy_ids(src, start, out, feature, pos, n):
    """Ids of n consecutive rows src[start:] into gather positions pos .. pos + n of
    out[batch, feature, row] (position p: row p % batch_size of batch p // batch_size) as int64
    (no shuffle: one part's run of a slice); returns the largest as uint64 (a negative id counts
    as huge, as `take_ids` returns it) for the caller's bounds check.

    Written over 1-d slices, LLVM vectorizes the cast copy and the max (and, for a signed dtype,
    the min) together, faster than numpy's casting assignment alone, so the check costs nothing.
    """
    b = out.shape[2]
    hi = lo = src.dtype.type(0)
    done = 0
    while done < n:
        i, j0 = (pos + done) // b, (pos + done) % b
        m = min(b - j0, n - done)
        ids = src[start + done : start + done + m]
        row = out[i, feature, j0 : j0 + m]
        for j in range(m):
            v = ids[j]
            row[j] = v
            if v > hi:
                hi = v
            if v < lo:
                lo = v
        done += m
    return np.uint64(np.int64(lo)) if lo < 0 else np.uint64(hi)


@njit(inline="always", nogil=True, boundscheck=False)
def _part_of(r, part_starts, parts):
    """The last part whose start is <= row r, without branches on the data (they mispredict
    on shuffled rows): count the starts <= r for a few parts, else a fixed-step search."""
    lo = 0
    if parts <= 32:
        for p in range(1, parts):
            lo += part_starts[p] <= r
    else:
        size = parts
        while size > 1:
            half = size >> 1
            lo += half * (part_starts[lo + half] <= r)
            size -= half
    return lo


@njit(cache=True, nogil=True, boundscheck=False)
def group_by_part(rows, part_starts):
    """Rows grouped by the part holding them, keeping their order inside each part.

    Args:
        rows: global row indices.
        part_starts: [parts + 1] first global row of each part, then the total.

    Returns:
        (counts [parts], where, local): the positions in `rows` of part 0's rows, then part
        1's, ... (`where`), and those rows' indices inside their part (`local`).
    """
    n, parts = rows.shape[0], part_starts.shape[0] - 1
    part_of = np.empty(n, np.int64)
    counts = np.zeros(parts, np.int64)
    for i in range(n):
        lo = _part_of(rows[i], part_starts, parts)
        part_of[i] = lo
        counts[lo] += 1
    fill = np.empty(parts, np.int64)
    total = 0
    for p in range(parts):
        fill[p] = total
        total += counts[p]
    where = np.empty(n, np.int64)
    local = np.empty(n, np.int64)
    for i in range(n):
        p = part_of[i]
        k = fill[p]
        fill[p] = k + 1
        where[k] = i
        local[k] = rows[i] - part_starts[p]
    return counts, where, local


@njit(cache=True, nogil=True, boundscheck=False)
def locate(rows, part_starts, part_of, local):
    """Fill part_of and local with the part and the row inside it of each global row.

    part_starts is [parts + 1]. The caller picks the narrowest dtypes that hold them: every
    column's kernel reads both arrays again, so their bytes count 26 times per row.
    """
    n, parts = rows.shape[0], part_starts.shape[0] - 1
    for i in range(n):
        r = rows[i]
        lo = _part_of(r, part_starts, parts)
        part_of[i] = lo
        local[i] = r - part_starts[lo]


@njit(cache=True, nogil=True, boundscheck=False)
def locate_indexed(rows, part_starts, first_part, shift, part_of, local):
    """`locate` through a coarse index: first_part[b] is the part holding row b << shift, and
    the row's part is that one or a few after it. For thousands of parts, where `locate`'s
    search takes ~14 dependent steps a row (10,000 parts: ~1/3 of the ids' gathers' time)."""
    parts = part_starts.shape[0] - 1
    for i in range(rows.shape[0]):
        r = rows[i]
        lo = first_part[r >> shift]
        # The step into the bucket's second part without a branch: shuffled rows take it about
        # half the time, unpredictably (part_starts[parts] is the total, past every row).
        lo += part_starts[lo + 1] <= r
        while lo + 1 < parts and part_starts[lo + 1] <= r:  # empty parts, or buckets over several
            lo += 1
        part_of[i] = lo
        local[i] = r - part_starts[lo]


UNHELD = np.iinfo(np.int64).min
"""The key base of a part the gathering thread does not hold (`locate_keys`)."""


@njit(cache=True, nogil=True, boundscheck=False)
def locate_keys(rows, part_starts, shift, second_start, bases, key_base, keys):
    """keys[k] = rows[k] + the key base of the part holding it: its key, (slot << key shift) |
    row inside the part (addresses.HeldParts), without writing where each row lies first.

    Rows go by buckets of 2**shift rows (many_parts.KeyBuckets): a bucket meets one part, or two
    whose boundary is second_start[b] (bases[b, 0] below it, bases[b, 1] from it on; past its
    rows where it meets one), or, second_start[b] -1, more: then the row's part is searched and
    key_base[part] read. One table row a bucket and no dependent search: 0.09 ms a shuffle
    window of 64 K rows over 120 parts, where `locate`, then packing its results, took 0.28 ms
    (~5% of the stream). Returns how many rows lie in parts not held (key base UNHELD); their
    keys are then meaningless."""
    parts = part_starts.shape[0] - 1
    missing = 0
    for k in range(rows.shape[0]):
        r = rows[k]
        b = r >> shift
        boundary = second_start[b]
        if boundary >= 0:
            base = bases[b, 1] if r >= boundary else bases[b, 0]
        else:  # a bucket over more than two parts (a part smaller than a bucket)
            base = key_base[_part_of(r, part_starts, parts)]
        missing += base == UNHELD
        keys[k] = r + base
    return missing


@njit(inline="always", nogil=True, boundscheck=False)
def _address(addresses, key, shift, stride):
    """Where the row of a packed key lies in a column given by its address per held part: the
    key is (slot << shift) | row inside the part (`locate_keys`)."""
    return addresses[key >> shift] + (key & ((1 << shift) - 1)) * stride


@njit(cache=True, nogil=True, boundscheck=False)
def take_values_parts(like, addresses, stride, keys, shift, out):
    """out[k] = the row keys[k] names of a 1-d column given by its address per held part (one
    stride for all)."""
    for k in range(out.shape[0]):
        out[k] = _load(_address(addresses, np.int64(keys[k]), shift, stride), like)


@njit(cache=True, nogil=True, boundscheck=False)
def take_rows_parts(like, addresses, stride, item_stride, keys, shift, out):
    """out[k, :] = that row of a 2-d column (dense features) of several parts."""
    for k in range(out.shape[0]):
        base = _address(addresses, np.int64(keys[k]), shift, stride)
        for j in range(out.shape[1]):
            out[k, j] = _load(base + j * item_stride, like)


@njit(cache=True, nogil=True, boundscheck=False)
def copy_rows_parts(addresses, stride, keys, shift, out):
    """`take_rows_parts` for rows stored contiguously (every part's row is out's row, byte for
    byte).

    One memcpy per row, as `copy_rows` for one part: faster than the value-by-value loop on
    Criteo's 13 float32 dense columns.
    """
    row = out.shape[1] * out.itemsize
    base = out.ctypes.data
    for k in range(out.shape[0]):
        _copy_bytes(base + k * row, _address(addresses, np.int64(keys[k]), shift, stride), row)


@njit(cache=True, nogil=True, boundscheck=False)
def byte_keys(keys, shift, stride, byte_shift, out):
    """out[k] = (slot << byte_shift) | row * stride of the packed key keys[k] ((slot << shift) |
    row): the row's byte offset in a column of that row stride, for `take_ids_columns_parts`."""
    mask = (1 << shift) - 1
    for k in range(keys.shape[0]):
        key = np.int64(keys[k])
        out[k] = ((key >> shift) << byte_shift) | ((key & mask) * stride)


@njit(cache=True, nogil=True, boundscheck=False)
def take_ids_columns_parts(
    like, addresses, columns, features, modulos, keys, shift, out, pos, highest
):
    """`take_ids` for rows of several parts and several one-hot features of one id dtype and row
    stride, in one call: column addresses[columns[c]] (an address per held part) goes to
    out[:, features[c], :] in order, each id written once, folded by modulos[c] if > 0, row k at
    gather position pos + k; highest[c] gets its largest id read, as `take_ids` returns it.

    Column by column inside the call, as separate calls would go: each column's slice of the
    window stays in cache while it is read (a row-by-row pass over all columns was slower, and so
    was a pass over two columns). What one call saves is 26 dispatches a gather and the per-call
    setup. One packed key a row (slot and row in 4 bytes where they fit) is one load a value
    where a part index and a row were two, ~10-15% of the pass; keys of the row's byte offset
    (`byte_keys`, (slot << shift) | offset), one pass a call, leave a value its slot's address
    plus the offset, no multiply: ~6% of the pass."""
    b, n = out.shape[2], keys.shape[0]
    mask = (1 << shift) - 1
    for c in range(features.shape[0]):
        hi = np.uint64(0)
        f, modulo = features[c], modulos[c]
        column = addresses[columns[c]]
        done = 0
        while done < n:
            i, j0 = (pos + done) // b, (pos + done) % b
            m = min(b - j0, n - done)
            dst, chunk = out[i, f, j0 : j0 + m], keys[done : done + m]
            if modulo > 0:  # two loops, so that LLVM compiles each without a branch
                for j in range(m):
                    key = np.int64(chunk[j])
                    v = np.int64(_load(column[key >> shift] + (key & mask), like))
                    hi = max(hi, np.uint64(v))
                    dst[j] = v % modulo
            else:
                for j in range(m):
                    key = np.int64(chunk[j])
                    v = np.int64(_load(column[key >> shift] + (key & mask), like))
                    hi = max(hi, np.uint64(v))
                    dst[j] = v
            done += m
        highest[c] = hi
