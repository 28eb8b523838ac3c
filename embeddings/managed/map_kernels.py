"""The id map's compiled loops: an open-addressing index (raw id -> slot), the remap of a batch's
raw ids into table rows with this rank's statistics counted on the way, and the table of ids
missed since the last update.

The index and the miss table probe linearly from mix64(id) over a power-of-two capacity; an empty
cell holds MISSING_KEY, which is never an id. Every loop is integer arithmetic: its results do not
depend on the order ids arrive in, only the statistics' sums and maxima do, and those are exact.
"""

from __future__ import annotations

import numpy as np

from shardrec.dataloader.format.raw_ids import MISSING_KEY
from shardrec.dataloader.util.jit import njit
from shardrec.dataloader.util.splitmix import mix64_scalar

EMPTY = np.uint64(MISSING_KEY)


def capacity_for(entries: int) -> int:
    """The power-of-two capacity that keeps `entries` at most half full (at least 16)."""
    return max(16, 1 << max(0, 2 * int(entries) - 1).bit_length())


@njit(cache=True, nogil=True)
def build_index(slot_keys, idx_keys, idx_slots):
    """Fill an emptied index with every used slot (slot_keys[s] != EMPTY)."""
    mask = np.uint64(len(idx_keys) - 1)
    idx_keys[:] = EMPTY
    for s in range(len(slot_keys)):
        key = slot_keys[s]
        if key == EMPTY:
            continue
        pos = mix64_scalar(key) & mask
        while idx_keys[pos] != EMPTY:
            pos = (pos + np.uint64(1)) & mask
        idx_keys[pos] = key
        idx_slots[pos] = s


@njit(cache=True, nogil=True)
def lookup(keys, idx_keys, idx_slots, out):
    """out[i] = the slot of keys[i], or -1 (not in the index, or missing)."""
    mask = np.uint64(len(idx_keys) - 1)
    for i in range(len(keys)):
        key = keys[i]
        out[i] = -1
        if key == EMPTY:
            continue
        pos = mix64_scalar(key) & mask
        while True:
            k = idx_keys[pos]
            if k == key:
                out[i] = idx_slots[pos]
                break
            if k == EMPTY:
                break
            pos = (pos + np.uint64(1)) & mask


@njit(cache=True, nogil=True)
def remap(keys, idx_keys, idx_slots, first_slot_row, shared_row, out):
    """Rows of raw ids, read only: missing -> 0, an id with a slot -> first_slot_row + slot, any
    other id -> shared_row."""
    mask = np.uint64(len(idx_keys) - 1)
    for i in range(len(keys)):
        key = keys[i]
        if key == EMPTY:
            out[i] = 0
            continue
        pos = mix64_scalar(key) & mask
        row = shared_row
        while True:
            k = idx_keys[pos]
            if k == key:
                row = first_slot_row + idx_slots[pos]
                break
            if k == EMPTY:
                break
            pos = (pos + np.uint64(1)) & mask
        out[i] = row


@njit(cache=True, nogil=True)
def remap_count(
    keys,
    counted,
    step,
    idx_keys,
    idx_slots,
    first_slot_row,
    shared_row,
    hits,
    lasts,
    miss_keys,
    miss_counts,
    miss_lasts,
    out,
):
    """remap, counting each id whose `counted` flag is set: a hit adds to its slot's hits and
    sets its last step; a miss to the miss table (which must have room: MissTable.reserve).
    Returns the number of new entries of the miss table."""
    mask = np.uint64(len(idx_keys) - 1)
    mmask = np.uint64(len(miss_keys) - 1)
    added = 0
    for i in range(len(keys)):
        key = keys[i]
        if key == EMPTY:
            out[i] = 0
            continue
        pos = mix64_scalar(key) & mask
        slot = -1
        while True:
            k = idx_keys[pos]
            if k == key:
                slot = idx_slots[pos]
                break
            if k == EMPTY:
                break
            pos = (pos + np.uint64(1)) & mask
        if slot >= 0:
            out[i] = first_slot_row + slot
            if counted[i]:
                hits[slot] += 1
                if lasts[slot] < step:
                    lasts[slot] = step
            continue
        out[i] = shared_row
        if not counted[i]:
            continue
        mpos = mix64_scalar(key) & mmask
        while True:
            k = miss_keys[mpos]
            if k == key:
                break
            if k == EMPTY:
                miss_keys[mpos] = key
                miss_counts[mpos] = 0
                miss_lasts[mpos] = step
                added += 1
                break
            mpos = (mpos + np.uint64(1)) & mmask
        miss_counts[mpos] += 1
        if miss_lasts[mpos] < step:
            miss_lasts[mpos] = step
    return added


@njit(cache=True, nogil=True)
def rehash(old_keys, old_counts, old_lasts, keys, counts, lasts):
    """Move every entry of one miss table into another (emptied, larger) one."""
    mask = np.uint64(len(keys) - 1)
    keys[:] = EMPTY
    for i in range(len(old_keys)):
        key = old_keys[i]
        if key == EMPTY:
            continue
        pos = mix64_scalar(key) & mask
        while keys[pos] != EMPTY:
            pos = (pos + np.uint64(1)) & mask
        keys[pos] = key
        counts[pos] = old_counts[i]
        lasts[pos] = old_lasts[i]


@njit(cache=True, nogil=True)
def hashed_rows(keys, rows, first_slot_row, out):
    """A hashed table's rows: missing -> 0, else first_slot_row + mix64(id) mod rows."""
    n = np.uint64(rows)
    for i in range(len(keys)):
        key = keys[i]
        out[i] = 0 if key == EMPTY else first_slot_row + np.int64(mix64_scalar(key) % n)


@njit(cache=True, nogil=True)
def compact(keys, counts, lasts, used):
    """The `used` entries of a miss table, in cell order."""
    out_k = np.empty(used, np.uint64)
    out_c = np.empty(used, np.int64)
    out_l = np.empty(used, np.int64)
    n = 0
    for i in range(len(keys)):
        if keys[i] != EMPTY:
            out_k[n] = keys[i]
            out_c[n] = counts[i]
            out_l[n] = lasts[i]
            n += 1
    return out_k[:n], out_c[:n], out_l[:n]


@njit(cache=True, nogil=True)
def merge_sorted(ak, ac, al, bk, bc, bl):
    """Two key-sorted lists of (key, count, last), each key once in each, merged into one: counts
    summed and lasts maxed where a key is in both."""
    n = len(ak) + len(bk)
    ok = np.empty(n, np.uint64)
    oc = np.empty(n, np.int64)
    ol = np.empty(n, np.int64)
    i = j = m = 0
    while i < len(ak) or j < len(bk):
        if j >= len(bk) or (i < len(ak) and ak[i] < bk[j]):
            ok[m], oc[m], ol[m] = ak[i], ac[i], al[i]
            i += 1
        elif i >= len(ak) or bk[j] < ak[i]:
            ok[m], oc[m], ol[m] = bk[j], bc[j], bl[j]
            j += 1
        else:
            ok[m], oc[m] = ak[i], ac[i] + bc[j]
            ol[m] = al[i] if al[i] > bl[j] else bl[j]
            i += 1
            j += 1
        m += 1
    return ok[:m], oc[:m], ol[:m]


@njit(cache=True, nogil=True)
def index_remove(keys, idx_keys, idx_slots):
    """Remove keys from an index (backward-shift deletion: no tombstones; every later probe
    sequence stays unbroken)."""
    mask = np.uint64(len(idx_keys) - 1)
    for i in range(len(keys)):
        key = keys[i]
        pos = mix64_scalar(key) & mask
        while idx_keys[pos] != key:
            if idx_keys[pos] == EMPTY:
                break
            pos = (pos + np.uint64(1)) & mask
        if idx_keys[pos] != key:
            continue
        hole = pos
        nxt = (hole + np.uint64(1)) & mask
        while idx_keys[nxt] != EMPTY:
            home = mix64_scalar(idx_keys[nxt]) & mask
            # The entry at nxt may move into the hole if its home is not cyclically in (hole, nxt].
            if ((nxt - home) & mask) >= ((nxt - hole) & mask):
                idx_keys[hole] = idx_keys[nxt]
                idx_slots[hole] = idx_slots[nxt]
                hole = nxt
            nxt = (nxt + np.uint64(1)) & mask
        idx_keys[hole] = EMPTY


@njit(cache=True, nogil=True)
def index_insert(keys, slots, idx_keys, idx_slots):
    """Insert keys (not in the index) with their slots."""
    mask = np.uint64(len(idx_keys) - 1)
    for i in range(len(keys)):
        pos = mix64_scalar(keys[i]) & mask
        while idx_keys[pos] != EMPTY:
            pos = (pos + np.uint64(1)) & mask
        idx_keys[pos] = keys[i]
        idx_slots[pos] = slots[i]
