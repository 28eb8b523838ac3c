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
"""Groups of rows a curve keeps: log-spaced by rank, so the hot head stays row-exact."""
ASSOCIATIVITY = 32
"""fbgemm's cache is 32-way set associative: it allocates whole sets of 32 rows."""


@dataclass(frozen=True)
class FrequencyCurve:
    """Measured lookups of a table's rows, hottest first, in groups of rows of similar frequency."""

    rows: tuple[int, ...]
    """Rows in each group (the last group may hold the rows never seen)."""
    lookups: tuple[float, ...]
    """Lookups of each group's rows in the measured sample."""
    table_rows: int
    batches: float
    """Global batches the sample spans (lookups per batch = sum(lookups) / batches)."""

    @property
    def lookups_per_batch(self) -> float:
        return sum(self.lookups) / self.batches if self.batches else 0.0

    def block(self, offset: int, rows: int, ids_by_frequency: bool) -> FrequencyCurve:
        """The curve of rows [offset, offset + rows) (a row-wise shard): the same rows of the hottest-first
        order when ids are numbered by frequency, else an even share of every group (hashed ids)."""
        if rows >= self.table_rows:
            return self
        share = rows / self.table_rows
        if not ids_by_frequency:
            return FrequencyCurve(
                tuple(max(1, round(r * share)) for r in self.rows),
                tuple(x * share for x in self.lookups),
                rows,
                self.batches,
            )
        starts = np.concatenate([[0], np.cumsum(self.rows)[:-1]])
        out_rows, out_lookups = [], []
        for start, n, x in zip(starts, self.rows, self.lookups):
            lo, hi = max(start, offset), min(start + n, offset + rows)
            if hi > lo:
                out_rows.append(int(hi - lo))
                out_lookups.append(x * (hi - lo) / n)
        return FrequencyCurve(tuple(out_rows), tuple(out_lookups), rows, self.batches)

    def to_dict(self) -> dict:
        return {
            "rows": list(self.rows),
            "lookups": list(self.lookups),
            "table_rows": self.table_rows,
            "batches": self.batches,
        }


def curve_from_counts(counts: np.ndarray, table_rows: int, batches: float, groups: int = GROUPS) -> FrequencyCurve:
    """A curve from the lookup count of every row seen (any order); rows never seen form the last group."""
    counts = np.sort(np.asarray(counts, dtype=np.int64)[np.asarray(counts) > 0])[::-1]
    seen = len(counts)
    if seen == 0:
        return FrequencyCurve((table_rows,), (0.0,), table_rows, batches)
    edges = np.unique(np.round(np.geomspace(1, seen, num=min(groups, seen))).astype(np.int64))
    edges = np.concatenate([[0], edges])
    sums = np.add.reduceat(counts, edges[:-1])
    rows = np.diff(edges)
    out_rows, out_lookups = [int(r) for r in rows], [float(s) for s in sums]
    if table_rows > seen:
        out_rows.append(table_rows - seen)
        out_lookups.append(0.0)
    return FrequencyCurve(tuple(out_rows), tuple(out_lookups), table_rows, batches)


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
    """Rows fbgemm allocates for a cache of `load_factor` of `rows`: whole 32-row sets, at least one."""
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
    """Chance that one of a row's `others` other batches falls in the `window` batches before a random one
    of the stream's `batches` (its occurrences placed at random: the loader shuffles), the window
    cut short at the start of the stream."""
    x = min(window / batches, 1.0)
    m = np.maximum(others, 0.0)
    early = x - (1 - (1 - x) ** (m + 1)) / (m + 1)  # requests in the first `window` batches
    late = (1 - x) * (1 - (1 - x) ** m)
    return early + late


def lru_hit_rate(curve: FrequencyCurve, capacity_rows: int) -> HitRate:
    """An LRU cache of `capacity_rows` over the curve's stream (module docstring): it holds the rows of the
    last T batches, T from sum_i 1 - (1 - q_i)^T = C; a row's request hits when another of its batches
    lies in the T before (so a row's first batch always misses)."""
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


def _at_least(threshold: float, others: np.ndarray, share: float) -> np.ndarray:
    """P(k >= threshold) for k ~ Binomial(others, share): of a row's other lookups, those before a point
    `share` of the way through the stream (non-integer `others`: the group's average)."""
    t = int(math.ceil(threshold))
    if t <= 0:
        return np.ones_like(others)
    if share >= 1.0:
        return (others >= t).astype(np.float64)
    pmf = (1 - share) ** others
    below = pmf.copy()
    for j in range(t - 1):
        pmf = pmf * np.maximum(others - j, 0.0) / (j + 1) * share / (1 - share)
        below += pmf
    return np.clip(1 - below, 0.0, 1.0)


def lfu_hit_rate(curve: FrequencyCurve, capacity_rows: int, points: int = 48) -> HitRate:
    """An LFU cache of `capacity_rows` with counts since the start (fbgemm's): at a point u of the stream
    it holds the rows counted most often so far: every row counted at least theta(u) times (theta the
    least count whose expected rows fit) and, in the slots left, a share of those counted theta - 1
    times. A request hits when its row's lookups before it put the row there (a first lookup misses)."""
    n, c, q, b = _presence(curve)
    others = np.maximum(c - 1, 0.0)
    hit = np.zeros_like(n)
    for u in (np.arange(points) + 0.5) / points:
        theta = 1
        while float((n * _at_least(theta, c, u)).sum()) > capacity_rows:
            theta += 1
        above = _at_least(theta, others, u)
        if theta >= 2:  # the boundary count shares the slots left; a row never seen before cannot
            held = float((n * _at_least(theta, c, u)).sum())
            at_boundary = float((n * (_at_least(theta - 1, c, u) - _at_least(theta, c, u))).sum())
            share = min(1.0, max(0.0, (capacity_rows - held) / at_boundary)) if at_boundary > 0 else 0.0
            above = above + share * (_at_least(theta - 1, others, u) - above)
        hit += above
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
    """The smallest cache the prediction holds for: four batches' unique rows. Near one batch's, fbgemm
    cannot insert a batch's misses (conflict misses); up to ~3, Che's approximation overestimates
    LRU hits by up to ~3 points (against exact caches replaying Zipf streams)."""
    n, _, q, _ = _presence(curve)
    return int(math.ceil(4 * (n * q).sum()))
