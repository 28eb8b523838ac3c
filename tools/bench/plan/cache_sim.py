"""Exact caches to replay an id stream through: LRU and LFU with fbgemm's batch semantics.

Both are fully associative (fbgemm's 32-way sets cost well under a point of hit rate once the
cache holds a few batches' rows) and work a batch at a time, as fbgemm's prefetch does: the
batch's unique rows are looked up, hits are marked used, then the misses are inserted (in
ascending id order) in place of rows not used by this batch:

- LRU evicts the rows used longest ago; a miss that finds no row to evict stays uncached.
- LFU keeps every row's count of lookups since the start and inserts a miss only in place of a
  cached row, not used by this batch, with a lower or equal count.

`step(ids)` returns (unique rows, unique hits, lookups, lookup hits) of the batch.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class BatchLRU:
    """Least recently used, batch at a time: timestamps per row, evicted oldest batch first."""

    def __init__(self, capacity: int, rows: int) -> None:
        self.capacity, self.size, self.time = capacity, 0, 0
        self.cached = np.zeros(rows, dtype=bool)
        self.last = np.full(rows, -1, dtype=np.int64)
        self.used: deque[tuple[int, np.ndarray]] = (
            deque()
        )  # (batch, its unique rows): eviction order

    def _evict(self, count: int) -> int:
        """Uncache up to `count` rows last used before this batch, oldest first; returns how
        many."""
        evicted = 0
        while evicted < count and self.used and self.used[0][0] < self.time:
            when, rows = self.used.popleft()
            live = rows[self.cached[rows] & (self.last[rows] == when)]
            take = live[: count - evicted]
            self.cached[take] = False
            evicted += len(take)
            if len(take) < len(live):
                self.used.appendleft((when, live[len(take) :]))
        return evicted

    def step(self, ids: np.ndarray) -> tuple[int, int, int, int]:
        unique, counts = np.unique(ids, return_counts=True)
        hit = self.cached[unique]
        self.last[unique] = self.time
        misses = unique[~hit]
        if len(misses) > self.capacity - self.size:
            self.size -= self._evict(len(misses) - (self.capacity - self.size))
        inserted = misses[: self.capacity - self.size]
        self.cached[inserted] = True
        self.size += len(inserted)
        self.used.append((self.time, unique))
        self.time += 1
        return len(unique), int(hit.sum()), len(ids), int(counts[hit].sum())


class BatchLFU:
    """Least frequently used, batch at a time, with cumulative counts (fbgemm's LFU)."""

    def __init__(self, capacity: int, rows: int) -> None:
        self.capacity = capacity
        self.counts = np.zeros(rows, dtype=np.int64)
        self.slot_of = np.full(rows, -1, dtype=np.int64)
        self.slots = np.full(capacity, -1, dtype=np.int64)  # row held by each slot, -1 free
        self.free = capacity

    def step(self, ids: np.ndarray) -> tuple[int, int, int, int]:
        unique, counts = np.unique(ids, return_counts=True)
        hit = self.slot_of[unique] >= 0
        self.counts[unique] += counts
        misses = unique[~hit]
        if len(misses):
            misses = misses[np.argsort(-self.counts[misses], kind="stable")]  # most frequent first
            fill = min(self.free, len(misses))
            if fill:  # slots are never freed: the free ones are the last `free`
                start = self.capacity - self.free
                self._insert(misses[:fill], np.arange(start, start + fill))
                misses = misses[fill:]
            if len(misses):
                self._replace(misses, unique)
        return len(unique), int(hit.sum()), len(ids), int(counts[hit].sum())

    def _insert(self, rows: np.ndarray, slots: np.ndarray) -> None:
        self.slots[slots] = rows
        self.slot_of[rows] = slots
        self.free -= len(rows)

    def _replace(self, misses: np.ndarray, batch: np.ndarray) -> None:
        """Misses (most frequent first) replace the least frequent cached rows not in this batch."""
        held = self.slots
        cost = self.counts[held].astype(np.float64)
        cost[np.isin(held, batch)] = np.inf  # never evict a row this batch uses
        k = min(len(misses), len(held))
        victims = np.argpartition(cost, k - 1)[:k] if k < len(held) else np.arange(len(held))
        victims = victims[np.argsort(cost[victims], kind="stable")]
        take = 0
        while (
            take < k
            and np.isfinite(cost[victims[take]])
            and self.counts[misses[take]] >= cost[victims[take]]
        ):
            take += 1
        slots, rows = victims[:take], misses[:take]
        self.slot_of[held[slots]] = -1
        self.slots[slots] = rows
        self.slot_of[rows] = slots
