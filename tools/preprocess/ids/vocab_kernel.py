"""Compiled (numba) vocabulary lookups: each row's value found in one pass, straight into the part's
column.

Vocabulary.lookup (numpy) takes ~10 passes over a column (a binary search over the whole table per
value, clamps, gathers, casts); here, with the same ids as the result, each value costs either
- one or two probes of a hash table (open addressing, linear probing, at most half full) of the
  vocabulary's 32-bit values: every such table of a process's vocabularies lives in one array,
  built once, so one compiled pass maps all of a row's features (as hashing mode does). Only
  vocabularies of at most HASH_MAX_VALUES values get a table, in feature order while the tables
  stay within HASH_BUDGET_BYTES: Criteo's columns but its largest; or
- a bucket bound and a binary search within its bucket (Vocabulary.bucket_starts: ~BUCKET_VALUES
  values, two cache lines, but ~5 mispredicted branches), which needs no memory beyond the mapped
  files.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardrec.dataloader.util.jit import njit
from shardrec.tools.preprocess.ids.id_maps import MISSING_ID, OOV_ID, Vocabulary

HASH_MAX_VALUES = 1 << 20  # a table of at most 2 M slots, 16 MB
HASH_BUDGET_BYTES = 64 << 20  # per process: the worst case's vocabularies (52 M values) get none
_EMPTY = np.uint64(0)  # a slot is value << 32 | id, and no kept value has id 0
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class HashTables:
    """The hash tables of one list of vocabularies, in one array."""

    slots: np.ndarray  # uint64: every table, one after another
    starts: np.ndarray  # int64 [features]: the first slot of each feature's table
    bits: (
        np.ndarray
    )  # int64 [features]: each table has 2**bits slots; 0: no table (searched instead)


def build_tables(vocabs: list[Vocabulary]) -> HashTables:
    """Tables for the vocabularies that get one (see the module's docstring)."""
    bits = np.zeros(len(vocabs), np.int64)
    starts = np.zeros(len(vocabs), np.int64)
    total = 0
    for f, vocab in enumerate(vocabs):
        n = len(vocab.sorted_values)
        b = max(1, (2 * n - 1).bit_length())  # 2**b >= 2n: at most half full
        # ids are 2 .. n + 1, 32-bit whenever n is this small; the values are sorted: the last is
        # the largest.
        if 0 < n <= HASH_MAX_VALUES and 8 * (total + (1 << b)) <= HASH_BUDGET_BYTES:
            if not int(vocab.sorted_values[-1]) >> 32:
                bits[f], starts[f], total = b, total, total + (1 << b)
    slots = np.zeros(total, np.uint64)
    for f in np.flatnonzero(bits):
        table = slots[starts[f] : starts[f] + (1 << bits[f])]
        _fill(np.asarray(vocabs[f].sorted_values), np.asarray(vocabs[f].ids), table, int(bits[f]))
    return HashTables(slots, starts, bits)


_TABLES: list = []  # [vocabs, their HashTables]: a process maps with one list of vocabularies


def tables_for(vocabs: list[Vocabulary]) -> HashTables:
    """build_tables(vocabs), kept for the next call with the same list."""
    if not _TABLES or _TABLES[0] is not vocabs:
        _TABLES[:] = [vocabs, build_tables(vocabs)]
    return _TABLES[1]


@njit(cache=True, nogil=True, boundscheck=False)
def _fill(table, ids, slots, bits):
    mask, shift = np.uint64(len(slots) - 1), np.uint64(64 - bits)
    for i in range(len(table)):
        v = np.uint64(table[i])
        s = (v * _GOLDEN) >> shift
        while slots[s] != _EMPTY:
            s = (s + np.uint64(1)) & mask
        slots[s] = (v << np.uint64(32)) | np.uint64(ids[i])


@njit(cache=True, nogil=True, boundscheck=False)
def _hash_rows_into(values, missing, rows, features, slots, starts, bits, out, offset):
    high = np.uint64(0xFFFFFFFF00000000)
    for k in range(len(rows)):
        r = rows[k]
        for j in range(len(features)):
            f = features[j]
            b = bits[f]
            if b == 0:
                continue  # searched afterwards
            if missing[r, f]:
                out[j, offset + k] = MISSING_ID
                continue
            v = values[r, f]
            found = np.uint64(OOV_ID)
            if (
                v >> np.uint64(32) == 0
            ):  # kept values are 32-bit: a wider one is never a match of its low bits
                key, base = v << np.uint64(32), np.uint64(starts[f])
                mask, s = np.uint64((1 << b) - 1), (v * _GOLDEN) >> np.uint64(64 - b)
                while slots[base + s] != _EMPTY:
                    if slots[base + s] & high == key:
                        found = slots[base + s] & np.uint64(0xFFFFFFFF)
                        break
                    s = (s + np.uint64(1)) & mask
            out[j, offset + k] = found


def lookup_features_into(
    vocabs: list[Vocabulary],
    values: np.ndarray,
    missing: np.ndarray,
    rows: np.ndarray,
    features: np.ndarray,
    out: np.ndarray,
    offset: int,
) -> None:
    """out[j, offset + k] = the id of values[rows[k], features[j]] in vocabs[features[j]], in out's
    dtype (Vocabulary.lookup's): by the hash tables in one pass, then the vocabularies without one
    by search."""
    tables = tables_for(vocabs)
    _hash_rows_into(
        values, missing, rows, features, tables.slots, tables.starts, tables.bits, out, offset
    )
    for j, f in enumerate(features):
        if not tables.bits[f]:
            lookup_rows_into(vocabs[f], values, missing, rows, int(f), out[j], offset)


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
    vocab: Vocabulary,
    values: np.ndarray,
    missing: np.ndarray,
    rows: np.ndarray,
    f: int,
    out: np.ndarray,
    offset: int,
) -> None:
    """out[offset + k] = the id of values[rows[k], f] (Vocabulary.lookup's), in out's dtype."""
    starts, shift = vocab.bucket_starts
    table, ids = (
        np.asarray(vocab.sorted_values),
        np.asarray(vocab.ids),
    )  # a memmap as a plain (read-only) array
    _lookup_into(values, missing, rows, f, table, ids, starts, np.uint64(shift), out, offset)
