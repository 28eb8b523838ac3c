"""One managed table's id map: raw 64-bit ids -> slots of the table, read only between updates,
with this rank's statistics since the last update.

Every rank holds the whole map (a replica). Between two updates the map does not change: each
rank remaps its own ids with it and counts, for the ids it trained on, the hits of each slot and
the ids it missed (MissTable). At an update every rank's statistics are combined by sums, maxima
and merges by id (`combine`: the order of ranks and batches does not matter), and every rank
applies the same integer update to the same inputs (map_update.apply_update). The map after an
update is therefore a function of the global stream of ids only: the same at any world size and
under any sharding type, and the same after a resume as without one.

numpy and numba only: no torch, so that `shardrec predict` and the planner use it lightly.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from shardrec.embeddings.managed import map_kernels as kernels
from shardrec.embeddings.managed.map_kernels import EMPTY, capacity_for
from shardrec.embeddings.managed.table_kinds import FIRST_SLOT_ROW, SHARED_ROW

NEVER = -1
"""The step of a slot never seen (or free)."""


@dataclass
class Pending:
    """Statistics since the last update: per slot, its hits and the last step it was seen; the
    ids without a slot (sorted), how often and when last they were seen."""

    hits: np.ndarray
    """int64 [rows]."""
    lasts: np.ndarray
    """int64 [rows], NEVER where not seen."""
    miss_keys: np.ndarray
    """uint64 [m], sorted, distinct."""
    miss_counts: np.ndarray
    """int64 [m]."""
    miss_lasts: np.ndarray
    """int64 [m]."""

    @classmethod
    def empty(cls, rows: int) -> Pending:
        return cls(
            np.zeros(rows, np.int64),
            np.full(rows, NEVER, np.int64),
            np.zeros(0, np.uint64),
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
        )


def merge_by_key(
    keys: np.ndarray, counts: np.ndarray, lasts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(keys, counts, lasts) with repeated keys merged: counts summed, lasts maxed; sorted by key."""
    if not len(keys):
        return keys.astype(np.uint64), counts.astype(np.int64), lasts.astype(np.int64)
    order = np.argsort(keys, kind="stable")
    keys, counts, lasts = keys[order], counts[order], lasts[order]
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    return (
        keys[starts],
        np.add.reduceat(counts, starts).astype(np.int64),
        np.maximum.reduceat(lasts, starts).astype(np.int64),
    )


def merge_sorted_lists(
    lists: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Key-sorted (keys, counts, lasts) lists, each key once per list, merged into one (counts
    summed, lasts maxed): linear merges, no sort."""
    out = (np.zeros(0, np.uint64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    for keys, counts, lasts in lists:
        out = kernels.merge_sorted(
            *out, keys.astype(np.uint64), counts.astype(np.int64), lasts.astype(np.int64)
        )
    return out


def combine(parts: list[Pending]) -> Pending:
    """Several ranks' statistics as one: hits summed, lasts maxed, misses merged by id (each
    rank's misses are sorted by id)."""
    return Pending(
        np.sum([p.hits for p in parts], axis=0).astype(np.int64),
        np.max([p.lasts for p in parts], axis=0).astype(np.int64),
        *merge_sorted_lists([(p.miss_keys, p.miss_counts, p.miss_lasts) for p in parts]),
    )


class MissTable:
    """Ids this rank missed since the last update, with their counts and last steps: an
    open-addressing table that doubles before it is half full."""

    def __init__(self, capacity: int = 1024) -> None:
        self._alloc(capacity_for(capacity // 2))
        self.used = 0

    def _alloc(self, cap: int) -> None:
        self.keys = np.full(cap, EMPTY, np.uint64)
        self.counts = np.zeros(cap, np.int64)
        self.lasts = np.zeros(cap, np.int64)

    def reserve(self, more: int) -> None:
        """Room for `more` new ids while staying at most half full."""
        if 2 * (self.used + more) <= len(self.keys):
            return
        old = (self.keys, self.counts, self.lasts)
        self._alloc(capacity_for(self.used + more))
        kernels.rehash(*old, self.keys, self.counts, self.lasts)

    def entries(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(keys sorted, counts, lasts) of every id in the table."""
        keys, counts, lasts = kernels.compact(self.keys, self.counts, self.lasts, self.used)
        order = np.argsort(keys, kind="stable")
        return keys[order], counts[order], lasts[order]

    def clear(self) -> None:
        if self.used:
            self.keys[:] = EMPTY
        self.used = 0

    def add(self, keys: np.ndarray, counts: np.ndarray, lasts: np.ndarray) -> None:
        """Merge entries into the table (a checkpoint's statistics)."""
        if not len(keys):
            return
        merged = merge_by_key(
            np.concatenate([self.entries()[0], keys]),
            np.concatenate([self.entries()[1], counts]),
            np.concatenate([self.entries()[2], lasts]),
        )
        self.clear()
        self.reserve(len(merged[0]))
        kernels.rehash(*_as_table(*merged), self.keys, self.counts, self.lasts)
        self.used = len(merged[0])


def _as_table(
    keys: np.ndarray, counts: np.ndarray, lasts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Entries as the (keys, counts, lasts) arrays rehash reads (no empty cells)."""
    return keys.astype(np.uint64), counts.astype(np.int64), lasts.astype(np.int64)


class IdMap:
    """The id -> slot map of one managed table (`rows` slots), with this rank's pending
    statistics.

    Args:
        rows: the table's slots (its rows are rows + 2: the missing row, the shared row).
    """

    def __init__(self, rows: int) -> None:
        self.rows = int(rows)
        self.slot_key = np.full(self.rows, EMPTY, np.uint64)
        self.slot_count = np.zeros(self.rows, np.int64)
        self.slot_last = np.full(self.rows, NEVER, np.int64)
        self.slot_born = np.full(self.rows, NEVER, np.int64)
        """The step the slot's id was admitted at (its row's generation)."""
        self.cand_key = np.zeros(0, np.uint64)
        self.cand_count = np.zeros(0, np.int64)
        self.cand_last = np.zeros(0, np.int64)
        cap = capacity_for(self.rows)
        self.idx_keys = np.full(cap, EMPTY, np.uint64)
        self.idx_slots = np.zeros(cap, np.int32)
        self.hits = np.zeros(self.rows, np.int64)
        self.lasts = np.full(self.rows, NEVER, np.int64)
        self.misses = MissTable()

    # --- the batch path ---------------------------------------------------------------------

    def rows_of(self, keys: np.ndarray) -> np.ndarray:
        """Table rows of raw ids (uint64), read only: evaluation and prediction."""
        out = np.empty(len(keys), np.int64)
        kernels.remap(keys, self.idx_keys, self.idx_slots, FIRST_SLOT_ROW, SHARED_ROW, out)
        return out

    def remap(self, keys: np.ndarray, counted: np.ndarray, step: int) -> np.ndarray:
        """Table rows of raw ids (uint64) a training step sees, counting those `counted` (a bool
        per id: padding rows are not) as seen at `step`."""
        out = np.empty(len(keys), np.int64)
        self.misses.reserve(len(keys))
        m = self.misses
        m.used += kernels.remap_count(
            keys,
            counted,
            np.int64(step),
            self.idx_keys,
            self.idx_slots,
            FIRST_SLOT_ROW,
            SHARED_ROW,
            self.hits,
            self.lasts,
            m.keys,
            m.counts,
            m.lasts,
            out,
        )
        return out

    # --- statistics and updates -------------------------------------------------------------

    def pending(self) -> Pending:
        """This rank's statistics since the last update."""
        return Pending(self.hits.copy(), self.lasts.copy(), *self.misses.entries())

    def pending_misses(self) -> int:
        """Lookups this rank counted on the shared row since the last update."""
        return int(self.misses.counts[self.misses.keys != EMPTY].sum())

    def clear_pending(self) -> None:
        self.hits[:] = 0
        self.lasts[:] = NEVER
        self.misses.clear()

    def set_pending(self, pending: Pending) -> None:
        """Replace this rank's statistics (a checkpoint's, combined over the ranks that saved)."""
        self.clear_pending()
        self.hits[:] = pending.hits
        self.lasts[:] = pending.lasts
        self.misses.add(pending.miss_keys, pending.miss_counts, pending.miss_lasts)

    def rebuild_index(self) -> None:
        kernels.build_index(self.slot_key, self.idx_keys, self.idx_slots)

    def reindex(self, removed: np.ndarray, slots: np.ndarray) -> None:
        """Update the index after an update: the `removed` ids out, the ids now in `slots` in (the
        same operations in the same order on every rank, so the replicas' indexes stay equal)."""
        kernels.index_remove(removed, self.idx_keys, self.idx_slots)
        kernels.index_insert(
            self.slot_key[slots], slots.astype(np.int32), self.idx_keys, self.idx_slots
        )

    def slot_of(self, keys: np.ndarray) -> np.ndarray:
        """The slot of each raw id, -1 where it has none."""
        out = np.empty(len(keys), np.int64)
        kernels.lookup(keys, self.idx_keys, self.idx_slots, out)
        return out

    @property
    def used(self) -> int:
        """Slots that hold an id."""
        return int((self.slot_key != EMPTY).sum())

    def digest(self) -> str:
        """sha256 of the map (every slot's id, count, last step and generation; the waiting
        ids): equal maps, equal digests."""
        h = hashlib.sha256()
        for a in (
            self.slot_key,
            self.slot_count,
            self.slot_last,
            self.slot_born,
            self.cand_key,
            self.cand_count,
            self.cand_last,
        ):
            h.update(np.ascontiguousarray(a).tobytes())
        return h.hexdigest()

    def host_bytes(self) -> int:
        """Bytes this replica holds now (its arrays; the miss table as it has grown)."""
        arrays = (
            self.slot_key,
            self.slot_count,
            self.slot_last,
            self.slot_born,
            self.cand_key,
            self.cand_count,
            self.cand_last,
            self.idx_keys,
            self.idx_slots,
            self.hits,
            self.lasts,
            self.misses.keys,
            self.misses.counts,
            self.misses.lasts,
        )
        return sum(a.nbytes for a in arrays)
