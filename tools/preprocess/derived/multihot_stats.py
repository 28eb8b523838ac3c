"""Planner statistics of a multi-hot dataset, counted while its parts are converted.

A multi-hot id column is a function of the one-hot one: one-hot id x of feature t becomes row
`x % rows_t` of t's index table. So the lookup count of every multi-hot id follows from the
lookup count of every one-hot id: each of x's c lookups adds c to each id of x's row (repeats
included). The workers count the one-hot ids of the training parts as they convert them (one
id a sample and feature, from columns already in memory); `feature_stats` then expands each
touched one-hot id once and adds its count to its row's ids. That is one row per distinct id
instead of one per sample, where the pass after conversion read every written id back (~214 a
sample at DLRMv2's sizes), several times the CPU. The integers are the same, so the statistics
are too.

Memory: one count per one-hot id of every counted feature, held until the end: uint32 while
the training split has fewer than 2^32 samples (no id is looked up more often than that; Criteo
1TB's 23 training days have 4.2 B), ~0.8 GB at MLPerf's 26 tables of up to 40 M rows, else
int64. Features whose one-hot or multi-hot table passes stats.MAX_EXACT_ROWS are not counted
here: the pass after conversion samples them, as before.
"""

from __future__ import annotations

import threading

import numpy as np

from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.multihot.multihot_tables import IndexTables
from shardrec.dataloader.util.jit import AVAILABLE, njit
from shardrec.tools.preprocess.parts import column_kernels
from shardrec.tools.preprocess.parts.feature_stats import MAX_EXACT_ROWS, feature_stats

EXPAND_IDS = 1 << 16
"""Touched one-hot ids expanded per step when the counts are spread over the table's rows."""


@njit(cache=True, nogil=True, boundscheck=False)
def _add_weighted(rows, weights, counts):
    """counts[rows[i, j]] += weights[i] for every i, j (a row's repeated ids count each time)."""
    n, size = rows.shape
    for i in range(n):
        w = weights[i]
        for j in range(size):
            counts[rows[i, j]] += w


class OneHotCounts:
    """Lookup counts of the one-hot ids of the training split, added part by part from the
    conversion's worker threads (one lock per feature: sums do not depend on the order)."""

    def __init__(self, manifest: Manifest, tables: IndexTables) -> None:
        self.manifest, self.tables = manifest, tables
        rows = tables.spec.rows
        self.counted = [
            t
            for t, f in enumerate(manifest.sparse_features)
            if f.cardinality <= MAX_EXACT_ROWS and rows[t] <= MAX_EXACT_ROWS
        ]
        train = manifest.splits["train"].rows if "train" in manifest.splits else 0
        dtype = (
            np.uint32 if train <= np.iinfo(np.uint32).max else np.int64
        )  # a count never passes `train`
        self.counts = {
            t: np.zeros(manifest.sparse_features[t].cardinality, dtype) for t in self.counted
        }
        self._locks = {t: threading.Lock() for t in self.counted}

    def add(self, t: int, ids: np.ndarray) -> None:
        """Count one training part's one-hot ids of feature t (a no-op for an uncounted feature)."""
        if t not in self.counts:
            return
        ids = np.asarray(ids)
        counts = self.counts[t]
        with self._locks[t]:
            if AVAILABLE:
                bad = column_kernels.count_ids(ids, counts)
            else:
                top = int(ids.max()) if ids.size else -1
                bad = top if top >= len(counts) else -1
                if bad < 0:
                    np.add(
                        counts,
                        np.bincount(ids, minlength=len(counts)),
                        out=counts,
                        casting="unsafe",
                    )
        if bad >= 0:
            name = self.manifest.sparse_features[t].name
            raise ValueError(
                f"{name}: one-hot id {bad} outside its {len(counts)} rows (corrupted source?)"
            )

    def multihot_counts(self, t: int) -> np.ndarray:
        """Lookup count of every multi-hot id of feature t (in id order, zeros included)."""
        src = self.counts[t]
        counts = np.zeros(self.tables.spec.rows[t], np.int64)
        touched = np.flatnonzero(src)
        for a in range(0, len(touched), EXPAND_IDS):
            ids = touched[a : a + EXPAND_IDS]
            rows = self.tables.expand(
                t, ids
            )  # folds ids past the table's rows, as the conversion does
            weights = src[ids].astype(np.int64)
            if AVAILABLE:
                _add_weighted(rows, weights, counts)
            else:
                np.add.at(counts, rows, weights[:, None])
        return counts

    def feature_stats(self, train_rows: int) -> dict[str, dict[str, float]]:
        """Statistics of every counted feature, equal to stats.compute_feature_stats's on the
        written training split. Frees each feature's one-hot counts once spread (call it once)."""
        out = {}
        for t in self.counted:
            counts = self.multihot_counts(t)
            del self.counts[t]  # the memory of the next feature's multi-hot counts
            size = self.tables.spec.sizes[t]
            # Every sample of a multi-hot feature has `size` ids: one such length gives the same
            # mean and p95 as all train_rows of them, without an array of a length per sample.
            lengths = np.full(min(train_rows, 1), size, np.int64) if size > 1 else None
            out[self.manifest.sparse_features[t].name] = feature_stats(
                counts[counts > 0], self.tables.spec.rows[t], lengths, False
            )
        return out

    def warm(self) -> None:
        """Load the compiled counting kernels for this dataset's id types (one-hot dtypes,
        int32 table rows), so that the first part converted does not pay for it."""
        if not AVAILABLE:
            return
        for t in self.counted:
            dtype = np.dtype(self.manifest.sparse_features[t].dtype)
            column_kernels.count_ids(np.zeros(0, dtype), self.counts[t])
        self.tables.expand(0, np.zeros(1, np.int64))  # multihot_counts' signature of the expansion
        _add_weighted(np.zeros((1, 1), np.int32), np.zeros(1, np.int64), np.zeros(1, np.int64))
