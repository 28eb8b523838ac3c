"""Compiled (numba) vocabulary lookups: each row's value found in one pass, straight into the part's column.

Vocabulary.lookup (numpy) takes ~10 passes over a column (a binary search over the whole table per
value, clamps, gathers, casts); here, with the same ids as the result, each value costs either
- one or two probes of a hash table (open addressing, linear probing, at most half full) of the
  vocabulary's 32-bit values, built once per process: for vocabularies of at most HASH_MAX_VALUES
  values while the process's tables stay within HASH_BUDGET_BYTES (Criteo's columns but its largest); or
- a bucket bound and a binary search within its bucket (Vocabulary.bucket_starts: ~BUCKET_VALUES
  values, two cache lines, but ~5 mispredicted branches), which needs no memory beyond the mapped files.
"""

from __future__ import annotations

import numpy as np

from shardrec.dataloader.jit import njit
from shardrec.tools.preprocess.ids import MISSING_ID, OOV_ID, Vocabulary

HASH_MAX_VALUES = 1 << 20  # a table of at most 2 M slots, 16 MB
HASH_BUDGET_BYTES = 64 << 20  # per process: the worst case's vocabularies (52 M values) get none
_EMPTY = np.uint64(0)  # a slot is value << 32 | id, and no kept value has id 0
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_BUILT_BYTES: list[int] = [0]  # this process's tables so far


@njit(cache=True, nogil=True, boundscheck=False)
def _fill_slots(table, ids, slots, bits):
    mask = np.uint64(len(slots) - 1)
    for i in range(len(table)):
        v = np.uint64(table[i])
        s = (v * _GOLDEN) >> np.uint64(64 - bits)
        while slots[s] != _EMPTY:
            s = (s + np.uint64(1)) & mask
        slots[s] = (v << np.uint64(32)) | np.uint64(ids[i])


def hash_slots(vocab: Vocabulary) -> tuple[np.ndarray, int] | None:
    """(slots, bits) of vocab's hash table, built on first use; None where it gets none (too large,
    values or ids past 32 bits, or this process's HASH_BUDGET_BYTES spent)."""
    if vocab.slots is None:
        n = len(vocab.sorted_values)
        bits = max(1, (2 * n - 1).bit_length())  # 2**bits >= 2n: at most half full
        # ids are 2 .. n + 1: 32-bit whenever n is small enough; the values are sorted: the last is the largest.
        small = 0 < n <= HASH_MAX_VALUES and _BUILT_BYTES[0] + (8 << bits) <= HASH_BUDGET_BYTES
        if not small or int(vocab.sorted_values[-1]) >> 32:
            vocab.slots = (np.zeros(0, np.uint64), 0)
        else:
            slots = np.zeros(1 << bits, np.uint64)
            _fill_slots(np.asarray(vocab.sorted_values), np.asarray(vocab.ids), slots, bits)
            _BUILT_BYTES[0] += slots.nbytes
            vocab.slots = (slots, bits)
    return vocab.slots if vocab.slots[1] else None


@njit(cache=True, nogil=True, boundscheck=False)
def _hash_lookup_into(values, missing, rows, f, slots, bits, out, offset):
    mask, shift = np.uint64(len(slots) - 1), np.uint64(64 - bits)
    for k in range(len(rows)):
        r = rows[k]
        if missing[r, f]:
            out[offset + k] = MISSING_ID
            continue
        v = values[r, f]
        found = np.uint64(OOV_ID)
        if v >> np.uint64(32) == 0:  # kept values are 32-bit: a wider one is never a match of its low bits
            key = v << np.uint64(32)
            s = (v * _GOLDEN) >> shift
            while slots[s] != _EMPTY:
                if slots[s] & np.uint64(0xFFFFFFFF00000000) == key:
                    found = slots[s] & np.uint64(0xFFFFFFFF)
                    break
                s = (s + np.uint64(1)) & mask
        out[offset + k] = found


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
    hashed = hash_slots(vocab)
    if hashed is not None:
        _hash_lookup_into(values, missing, rows, f, hashed[0], hashed[1], out, offset)
        return
    starts, shift = vocab.bucket_starts
    table, ids = np.asarray(vocab.sorted_values), np.asarray(vocab.ids)  # a memmap as a plain (read-only) array
    _lookup_into(values, missing, rows, f, table, ids, starts, np.uint64(shift), out, offset)
