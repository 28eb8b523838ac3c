"""Hit rates of a UVM cache (fbgemm's FUSED_UVM_CACHING) from a table's id-frequency curve.

fbgemm keeps the hottest rows of a UVM table in HBM and, once per batch, fetches the batch's
uncached unique rows from host memory (evicting rows not used by this batch). How often a lookup
finds its row in HBM depends on the data: a Zipf-skewed table with a cache of a tenth of its rows
hits 40-80% of a batch's rows, where torchrec's estimator assumes the cache's share of rows.

A FrequencyCurve is the measured count of every row over a stream of batches, hottest first,
grouped into a few hundred groups of rows of similar count. The stream is the one the cache
will see (the loader shuffles: a row's batches fall at random), so the models count each
row's first batch as a miss:

- LRU (fbgemm's default), Che's approximation at batch granularity: a row is in a batch with
  q = 1 - (1 - c/N)^L; the cache holds the rows of the last T batches, T from
  sum_i 1 - (1 - q_i)^T = C; a request hits when another of the row's batches lies in the T
  before it.
- LFU (counts since the start): at a point u of the stream the cache holds the rows counted most
  so far (those counted at least theta(u), the least count whose expected rows fit, and a share
  of those at theta - 1); a request hits when its row's earlier lookups reach that.

Rates are per unique row of a batch (fbgemm's cache statistics: one fetch per missed unique row)
and per lookup (a lookup hits when its row was cached before the batch). Against exact caches
replaying Zipf streams (tests/unit/test_plan_cache.py, `shardrec bench hitrate`) both are within
2 points once the cache holds a few batches' unique rows (`min_cache_rows`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

GROUPS = 256
"""Groups of the rows below the head a curve keeps, log-spaced by rank."""
HEAD = 1024
"""Hottest rows a curve keeps one by one, with their ids: they take most lookups, and a row-wise
block's hit rate depends on which of them it holds."""
ASSOCIATIVITY = 32
"""fbgemm's cache is 32-way set associative: it allocates whole sets of 32 rows."""


@dataclass(frozen=True)
class FrequencyCurve:
    """Measured lookups of a table's rows, hottest first, in groups of rows of similar frequency."""

    rows: tuple[float, ...]
    """Rows in each group (the last group may hold the rows never seen; a row-wise block's expected
    rows need not be whole)."""
    lookups: tuple[float, ...]
    """Lookups of each group's rows in the measured sample."""
    table_rows: int
    batches: float
    """Global batches the sample spans (lookups per batch = sum(lookups) / batches)."""
    head_ids: tuple[int, ...] = ()
    """Ids of the first len(head_ids) rows (groups of one row each), hottest first."""

    @property
    def lookups_per_batch(self) -> float:
        return sum(self.lookups) / self.batches if self.batches else 0.0

    def block(self, offset: int, rows: int, ids_by_frequency: bool) -> FrequencyCurve:
        """The curve of rows [offset, offset + rows) (a row-wise shard). Ids numbered by frequency:
        the same rows of the hottest-first order. Hashed ids: the head rows whose ids fall in the
        block, and of every other group the rows that do on average (same count, a share of the
        rows)."""
        if rows >= self.table_rows:
            return self
        if ids_by_frequency:
            return self._rank_block(offset, rows)
        share, head = rows / self.table_rows, len(self.head_ids)
        kept = [k for k, i in enumerate(self.head_ids) if offset <= i < offset + rows]
        return FrequencyCurve(
            tuple([1.0] * len(kept)) + tuple(r * share for r in self.rows[head:]),
            tuple(self.lookups[k] for k in kept) + tuple(x * share for x in self.lookups[head:]),
            rows,
            self.batches,
            tuple(self.head_ids[k] - offset for k in kept),
        )

    def _rank_block(self, offset: int, rows: int) -> FrequencyCurve:
        starts = np.concatenate([[0], np.cumsum(self.rows)[:-1]])
        out_rows, out_lookups = [], []
        for start, n, x in zip(starts, self.rows, self.lookups):
            lo, hi = max(start, offset), min(start + n, offset + rows)
            if hi > lo:
                out_rows.append(float(hi - lo))
                out_lookups.append(x * (hi - lo) / n)
        return FrequencyCurve(tuple(out_rows), tuple(out_lookups), rows, self.batches)

    def to_dict(self) -> dict:
        return {
            "rows": list(self.rows),
            "lookups": list(self.lookups),
            "table_rows": self.table_rows,
            "batches": self.batches,
        }


def curve_from_counts(
    counts: np.ndarray, table_rows: int, batches: float, groups: int = GROUPS
) -> FrequencyCurve:
    """A curve from every row's lookup count, indexed by id: the HEAD hottest rows one by one (with
    their ids), the other rows seen in log-spaced groups by rank, the rows never seen last."""
    counts = np.asarray(counts, dtype=np.int64)
    seen = np.flatnonzero(counts)
    if len(seen) == 0:
        return FrequencyCurve((float(table_rows),), (0.0,), table_rows, batches)
    order = seen[np.argsort(-counts[seen], kind="stable")]
    ranked = counts[order]
    head = min(HEAD, len(order))
    rows, lookups = [1.0] * head, [float(c) for c in ranked[:head]]
    tail = ranked[head:]
    if len(tail):
        edges = np.unique(
            np.round(np.geomspace(1, len(tail), num=min(groups, len(tail)))).astype(np.int64)
        )
        edges = np.concatenate([[0], edges])
        rows += [float(r) for r in np.diff(edges)]
        lookups += [float(x) for x in np.add.reduceat(tail, edges[:-1])]
    if table_rows > len(seen):
        rows.append(float(table_rows - len(seen)))
        lookups.append(0.0)
    return FrequencyCurve(
        tuple(rows), tuple(lookups), table_rows, batches, tuple(int(i) for i in order[:head])
    )


@dataclass(frozen=True)
class HitRate:
    """Predicted cache behaviour of one table shard per global batch."""

    unique_hit_rate: float
    """Share of the batch's unique rows found in the cache (fbgemm's cache statistics' basis)."""
    lookup_hit_rate: float
    """Share of lookups whose row was cached before the batch."""
    unique_rows: float
    """Unique rows per batch."""
    fetched_rows: float
    """Rows fetched from host memory per batch (unique misses)."""


def slots(rows: int, load_factor: float) -> int:
    """Rows fbgemm allocates for a cache of `load_factor` of `rows`: whole 32-row sets, at least
    one."""
    return max(1, math.ceil(rows * load_factor / ASSOCIATIVITY)) * ASSOCIATIVITY


def _presence(curve: FrequencyCurve) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per group: rows n, lookups per row c, probability q that a row is in a batch, and b = batches
    (of the curve's) that contain it."""
    n = np.asarray(curve.rows, dtype=np.float64)
    c = np.asarray(curve.lookups, dtype=np.float64) / np.maximum(n, 1)
    total, batches = max(sum(curve.lookups), 1.0), max(curve.batches, 1.0)
    L = total / batches
    q = -np.expm1(L * np.log1p(-np.minimum(c / total, 1 - 1e-12)))
    return n, c, q, q * batches


def _window_hit(others: np.ndarray, window: float, batches: float) -> np.ndarray:
    """Chance that one of a row's `others` other batches falls in the `window` batches before a
    random one of the stream's `batches` (its occurrences placed at random: the loader shuffles),
    the window cut short at the start of the stream."""
    x = min(window / batches, 1.0)
    m = np.maximum(others, 0.0)
    early = x - (1 - (1 - x) ** (m + 1)) / (m + 1)  # requests in the first `window` batches
    late = (1 - x) * (1 - (1 - x) ** m)
    return early + late


def lru_hit_rate(curve: FrequencyCurve, capacity_rows: int) -> HitRate:
    """An LRU cache of `capacity_rows` over the curve's stream (module docstring): it holds the rows
    of the last T batches, T from sum_i 1 - (1 - q_i)^T = C; a row's request hits when another of
    its batches lies in the T before (so a row's first batch always misses)."""
    n, c, q, b = _presence(curve)
    live = q > 0
    log_miss = np.log1p(-np.minimum(q, 1 - 1e-15))

    def held(t: float) -> float:
        return float((n * -np.expm1(t * log_miss)).sum())

    if capacity_rows >= n[live].sum():
        window = float(curve.batches)
    else:
        lo, hi = 0.0, 1.0
        while held(hi) < capacity_rows and hi < 1e12:
            hi *= 2
        for _ in range(80):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if held(mid) < capacity_rows else (lo, mid)
        window = hi
    hit = _window_hit(b - 1, window, max(curve.batches, 1.0)) * live
    return _rates(curve, n, c, q, b, hit)


def _at_least(threshold: np.ndarray, trials: np.ndarray, share: float) -> np.ndarray:
    """P(k >= threshold) for k ~ Binomial(trials, share), per group (non-integer `trials`: the
    group's average; `threshold` whole numbers)."""
    t = np.maximum(np.asarray(threshold, dtype=np.int64), 0)
    if share >= 1.0:
        return (trials >= t).astype(np.float64)
    pmf = (1 - share) ** trials
    below = np.where(t > 0, pmf, 0.0)
    for j in range(int(t.max(initial=0)) - 1):
        pmf = pmf * np.maximum(trials - j, 0.0) / (j + 1) * share / (1 - share)
        below += np.where(j + 1 < t, pmf, 0.0)
    return np.clip(1 - below, 0.0, 1.0)


def lfu_hit_rate(curve: FrequencyCurve, capacity_rows: int, points: int = 48) -> HitRate:
    """An LFU cache of `capacity_rows` with counts since the start (fbgemm's): at a point u of the
    stream it holds the rows counted most often so far: every row counted at least theta(u) times
    (theta the least count whose expected rows fit) and, in the slots left, a share of those a step
    below. A row is counted batch by batch (its lookups per batch times the batches it was in), and
    a request hits when the row's earlier batches put it there (its first batch misses)."""
    n, c, q, b = _presence(curve)
    per_batch = np.where(b > 0, c / np.maximum(b, 1e-12), 1.0)
    hit = np.zeros_like(n)
    for u in (np.arange(points) + 0.5) / points:
        theta = 1
        while float((n * _at_least(np.ceil(theta / per_batch), b, u)).sum()) > capacity_rows:
            theta += 1
        level = np.maximum(np.ceil(theta / per_batch), 1)  # batches a row needs to be held at u
        held_rows = float((n * _at_least(level, b, u)).sum())
        below = np.maximum(level - 1, 1)  # the step below; a row in no earlier batch is never held
        at_boundary = float(
            (n * (_at_least(level - 1, b, u) - _at_least(level, b, u)) * (level > 1)).sum()
        )
        spare = (
            min(1.0, max(0.0, (capacity_rows - held_rows) / at_boundary))
            if at_boundary > 0
            else 0.0
        )
        above = _at_least(level, b - 1, u)
        hit += above + spare * (level > 1) * (_at_least(below, b - 1, u) - above)
    return _rates(curve, n, c, q, b, hit / points)


def _rates(curve: FrequencyCurve, n, c, q, b, hit) -> HitRate:
    batches = max(curve.batches, 1.0)
    requests = float((n * b).sum())
    misses = float((n * b * (1 - hit)).sum())
    lookups = float((n * c).sum())
    return HitRate(
        unique_hit_rate=1 - misses / requests if requests else 1.0,
        lookup_hit_rate=float((n * c * hit).sum()) / lookups if lookups else 1.0,
        unique_rows=requests / batches,
        fetched_rows=misses / batches,
    )


def min_cache_rows(curve: FrequencyCurve) -> int:
    """The smallest cache the prediction holds for: four batches' unique rows. Near one batch's,
    fbgemm cannot insert a batch's misses (conflict misses); up to ~3, Che's approximation
    overestimates LRU hits by up to ~3 points (against exact caches replaying Zipf streams)."""
    n, _, q, _ = _presence(curve)
    return int(math.ceil(4 * (n * q).sum()))
