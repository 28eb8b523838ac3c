"""Per-feature statistics the planner reads from the manifest, computed on the training split.

- mean_ids_per_sample / p95_ids_per_sample: pooling factor (1 for one-hot features);
- distinct_ids: rows of the table that at least one training lookup touches;
- top1_share / top10_share: share of lookups that hit the hottest 1% / 10% of the table's
  rows (k = ceil(cardinality * p)), which is what a cache or a row-wise split sees.

Counts come from one compiled counting pass (np.bincount without numba) over the written id columns,
one feature at a time, so memory is one int64 per table row; the top-k shares take a partition of
the counts, not a sort. Tables above `MAX_EXACT_ROWS` rows are measured on their first `SAMPLE_IDS`
ids instead, and the stats say so (`sampled: 1`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.dataloader.format.manifest import Manifest, SparseFeature
from shardrec.dataloader.format.part_file import manifest_layout, open_part
from shardrec.dataloader.format.raw_ids import MISSING_KEY
from shardrec.tools.preprocess.ids.id_maps import count_values, merge_counts
from shardrec.tools.preprocess.parse import parse_kernel
from shardrec.tools.preprocess.parts import column_kernels

MAX_EXACT_ROWS = 1 << 27
SAMPLE_IDS = 50_000_000


def id_counts(columns: Iterable[np.ndarray], cardinality: int) -> tuple[np.ndarray, bool]:
    """Lookup count of every touched id (in id order); and whether only a sample was read."""
    if cardinality <= MAX_EXACT_ROWS:
        counts = np.zeros(cardinality, dtype=np.int64)
        for col in columns:
            if parse_kernel.AVAILABLE:
                bad = column_kernels.count_ids(np.asarray(col), counts)
                if bad >= 0:
                    raise ValueError(f"id {bad} is outside the table of {cardinality} rows")
            else:
                counts += np.bincount(np.asarray(col), minlength=cardinality)
        return counts[counts > 0], False
    taken, seen = [], 0
    for col in columns:
        take = np.asarray(col[: SAMPLE_IDS - seen])
        taken.append(take)
        seen += len(take)
        if seen >= SAMPLE_IDS:
            break
    _, counts = np.unique(
        np.concatenate(taken) if taken else np.zeros(0, np.int64), return_counts=True
    )
    return counts, True


def id_frequencies(columns: Iterable[np.ndarray], cardinality: int) -> tuple[np.ndarray, bool]:
    """Lookup count of every touched id, hottest first; and whether only a sample was read."""
    counts, sampled = id_counts(columns, cardinality)
    return np.sort(counts)[::-1], sampled


def _top_sum(frequencies: np.ndarray, k: int) -> np.int64:
    """Sum of the k largest frequencies: a partition, not a sort (the same integer)."""
    n = len(frequencies)
    if k >= n:
        return frequencies.sum()
    return np.partition(frequencies, n - k)[n - k :].sum()


def feature_stats(
    frequencies: np.ndarray, cardinality: int, lengths: np.ndarray | None, sampled: bool
) -> dict[str, float]:
    """Planner statistics from the lookup count of every touched id (in any order)."""
    total = int(frequencies.sum())

    def share(p: float) -> float:
        k = max(1, math.ceil(cardinality * p))
        return float(_top_sum(frequencies, k) / total) if total else 0.0

    if lengths is None:
        mean, p95 = 1.0, 1.0
    else:
        mean = float(lengths.mean()) if len(lengths) else 0.0
        p95 = float(np.percentile(lengths, 95)) if len(lengths) else 0.0
    return {
        "mean_ids_per_sample": round(mean, 6),
        "p95_ids_per_sample": round(p95, 6),
        "distinct_ids": int(len(frequencies)),
        "top1_share": round(share(0.01), 6),
        "top10_share": round(share(0.10), 6),
        "lookups": total,
        "sampled": int(sampled),
    }


EXACT_COUNTS = 64
"""Count-of-counts of raw ids: exact up to this count, then in bins that double."""


def raw_id_counts(columns: Iterable[np.ndarray]) -> np.ndarray:
    """Lookup count of every distinct raw id (missing values left out; 16 B per distinct id)."""
    pairs = [
        count_values(np.asarray(col), np.asarray(col) == np.uint64(MISSING_KEY)) for col in columns
    ]
    return merge_counts(pairs)[1]


def count_of_counts(counts: np.ndarray) -> list[list[int]]:
    """[count_lo, count_hi, ids, lookups] per count up to EXACT_COUNTS, then per doubling bin:
    how many ids were seen how often, and their lookups; the distinct-id curve (rows that hold a
    share of the lookups of ids seen at least K times) follows from it."""
    out = []
    if not len(counts):
        return out
    small = counts[counts <= EXACT_COUNTS]
    ids = np.bincount(small, minlength=EXACT_COUNTS + 1)
    for c in np.flatnonzero(ids):
        out.append([int(c), int(c), int(ids[c]), int(c * ids[c])])
    lo = EXACT_COUNTS + 1
    top = int(counts.max())
    while lo <= top:
        hi = 2 * lo - 1
        inside = counts[(counts >= lo) & (counts <= hi)]
        if len(inside):
            out.append([lo, hi, int(len(inside)), int(inside.sum())])
        lo = hi + 1
    return out


def raw_feature_stats(columns: Iterable[np.ndarray], lengths: np.ndarray | None) -> dict[str, Any]:
    """Planner statistics of a raw-id feature: feature_stats over its distinct ids (the top shares
    of its distinct ids, not of a table's rows), with its count-of-counts."""
    counts = raw_id_counts(columns)
    stats: dict[str, Any] = feature_stats(counts, max(1, len(counts)), lengths, False)
    stats["count_of_counts"] = count_of_counts(counts)
    return stats


def _columns(
    directory: Path, manifest: Manifest, split: str, name: str, offsets: bool = False
) -> Iterator[np.ndarray]:
    """One feature's id column (or its offsets) of each part, one part mapped at a time: each is
    unmapped once the next is read, so the process's RSS stays one column, not the whole split."""
    layout = manifest_layout(manifest, directory)
    for info in manifest.splits[split].parts if split in manifest.splits else []:
        part = open_part(directory, split, info, manifest, layout)
        yield part.offsets[name] if offsets else part.sparse[name]


def _lengths(directory: Path, manifest: Manifest, split: str, name: str) -> np.ndarray:
    diffs = [np.diff(off) for off in _columns(directory, manifest, split, name, offsets=True)]
    return np.concatenate(diffs) if diffs else np.zeros(0, np.int64)


def compute_feature_stats(
    directory: Path,
    manifest: Manifest,
    split: str = "train",
    workers: int = 1,
    features: list[SparseFeature] | None = None,
) -> dict[str, dict[str, float]]:
    """Statistics of every sparse feature (or of `features`) over one split of a written dataset;
    `workers` features at once, on threads (reading and counting release the GIL)."""
    features = manifest.sparse_features if features is None else features

    def one(feat: SparseFeature) -> dict[str, float]:
        if feat.raw:
            lengths = _lengths(directory, manifest, split, feat.name) if feat.multi_hot else None
            return raw_feature_stats(_columns(directory, manifest, split, feat.name), lengths)
        freqs, sampled = id_counts(
            _columns(directory, manifest, split, feat.name), feat.cardinality
        )
        lengths = _lengths(directory, manifest, split, feat.name) if feat.multi_hot else None
        return feature_stats(freqs, feat.cardinality, lengths, sampled)

    with ThreadPoolExecutor(workers, thread_name_prefix="shardrec-stats") as pool:
        return {f.name: s for f, s in zip(features, pool.map(one, features))}


def frequency_curves(
    directory: Path, manifest: Manifest, split: str = "train"
) -> dict[str, np.ndarray]:
    """Per feature, lookup counts by id rank (hottest first): the data of `data stats --plot`."""
    return {
        f.name: np.sort(raw_id_counts(_columns(directory, manifest, split, f.name)))[::-1]
        if f.raw
        else id_frequencies(_columns(directory, manifest, split, f.name), f.cardinality)[0]
        for f in manifest.sparse_features
    }
