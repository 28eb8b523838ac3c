"""Row budgets of managed tables from the data's distinct-id curve (`shardrec plan` proposes them).

"The rows that hold 99% of the traffic", taken literally, is nearly every distinct id: a day of a
click log is dominated, in count, by ids seen once, and an id seen once never earns a slot under
admission after K sightings anyway. So a table's budget is the rows that hold 99% of the lookups of
the ids seen at least K (admit_after) times in the data, plus 10% for the ids that come and go
between two updates. It follows exactly from the count-of-counts preprocessing records per raw-id
feature (tools/preprocess/parts/feature_stats.py: how many ids were seen how often).

When the budgets do not fit the memory the plan leaves, they are cut by water-filling: every table
keeps its most-looked-up ids down to one common threshold of lookups per byte of a row, so that the
last byte spent on any table buys as much traffic as on any other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SHARE = 0.99
HEADROOM = 1.1


@dataclass(frozen=True)
class CountCurve:
    """How many ids were seen how often: per bin, the ids and their lookups (counts ascending)."""

    low: np.ndarray
    """Smallest count of each bin."""
    ids: np.ndarray
    lookups: np.ndarray

    @classmethod
    def from_stats(cls, count_of_counts: list[list[int]]) -> CountCurve:
        rows = np.asarray(count_of_counts, dtype=np.int64).reshape(-1, 4)
        return cls(rows[:, 0], rows[:, 2], rows[:, 3])

    def seen(self, admit: int) -> CountCurve:
        """The ids seen at least `admit` times (counts up to 64 are exact bins)."""
        keep = self.low >= admit
        return CountCurve(self.low[keep], self.ids[keep], self.lookups[keep])

    @property
    def distinct(self) -> int:
        return int(self.ids.sum())

    def rows_for(self, share: float) -> int:
        """The fewest ids whose lookups make `share` of the curve's lookups (hottest first)."""
        total = float(self.lookups.sum())
        if total == 0:
            return 0
        want, rows = share * total, 0
        for ids, lookups in zip(self.ids[::-1], self.lookups[::-1]):
            if lookups < want:
                want -= lookups
                rows += int(ids)
                continue
            return rows + max(1, math.ceil(want / (lookups / ids)))
        return rows

    def kept(self, rows: int) -> float:
        """Share of the lookups the `rows` hottest ids hold."""
        total = float(self.lookups.sum())
        got, left = 0.0, rows
        for ids, lookups in zip(self.ids[::-1], self.lookups[::-1]):
            take = min(left, int(ids))
            got += lookups * take / ids
            left -= take
            if left <= 0:
                break
        return got / total if total else 0.0

    def rows_above(self, lookups_per_id: float) -> int:
        """Ids seen at least `lookups_per_id` times (bins by their mean count)."""
        mean = self.lookups / np.maximum(self.ids, 1)
        return int(self.ids[mean >= lookups_per_id].sum())


@dataclass(frozen=True)
class Proposal:
    """One managed table's proposed budget."""

    feature: str
    distinct: int
    """Distinct ids in the data."""
    wanted: int
    """Rows for 99% of the lookups of ids seen at least K times, plus headroom."""
    rows: int
    """The proposal: `wanted`, or less where memory is short."""
    kept: float
    """Share of all the feature's lookups the proposal's hottest ids hold."""
    bytes_per_row: float
    """Memory a row costs over all ranks (device and id map replicas)."""


def propose_rows(
    curves: dict[str, CountCurve],
    admit: dict[str, int],
    bytes_per_row: dict[str, float],
    budget_bytes: float,
) -> list[Proposal]:
    """Budgets of the managed tables `curves` names, within `budget_bytes` over all ranks."""
    wanted = {
        f: max(1, math.ceil(HEADROOM * c.seen(admit[f]).rows_for(SHARE))) for f, c in curves.items()
    }
    rows = dict(wanted)
    if sum(rows[f] * bytes_per_row[f] for f in rows) > budget_bytes:
        rows = _water_fill(curves, admit, bytes_per_row, wanted, budget_bytes)
    return [
        Proposal(f, c.distinct, wanted[f], rows[f], c.kept(rows[f]), bytes_per_row[f])
        for f, c in curves.items()
    ]


def _water_fill(curves, admit, bytes_per_row, wanted, budget_bytes) -> dict[str, int]:
    """Rows per table, its most-looked-up ids first, taken across tables in order of lookups per
    byte until `budget_bytes` is spent (the last group of ids in part): every table is cut at one
    common lookups-per-byte threshold."""
    groups = []  # (lookups per id per byte, feature, ids)
    for f, c in curves.items():
        seen, left = c.seen(admit[f]), wanted[f]
        for ids, lookups in zip(seen.ids[::-1], seen.lookups[::-1]):
            take = min(int(ids), left)
            if take <= 0:
                break
            groups.append((lookups / ids / bytes_per_row[f], f, take))
            left -= take
    rows = dict.fromkeys(curves, 0)
    left = float(budget_bytes)
    for _, f, ids in sorted(groups, key=lambda g: (-g[0], g[1])):
        take = min(ids, int(left // bytes_per_row[f]))
        rows[f] += take
        left -= take * bytes_per_row[f]
        if take < ids:
            break
    return {f: max(1, r) for f, r in rows.items()}
