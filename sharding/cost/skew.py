"""Id skew: how a table's lookups spread over its rows, from the manifest's statistics.

When preprocessing builds a vocabulary (`--min-count`), ids are given in order of decreasing
frequency, so the hottest rows sit together at the start of the table and row-wise sharding's
first block receives far more than its share of lookups. The manifest records, per feature,
the share of lookups that hit the hottest 1% and 10% of rows; a concentration curve through
(0, 0), (1%, top1_share), (10%, top10_share), (100%, 1) gives the share of lookups of any
contiguous block of rows. Hashed ids (`--max-ids`) scatter hot values over the table, so
there a block's lookups follow its rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from torchrec.modules.embedding_configs import EmbeddingBagConfig


@dataclass(frozen=True)
class LookupCurve:
    """Share of lookups in the first fraction f of rows (ids ordered hottest first)."""

    top1: float
    top10: float

    def cumulative(self, f: float) -> float:
        xs = (0.0, 0.01, 0.1, 1.0)
        ys = (0.0, self.top1, max(self.top1, self.top10), 1.0)
        return float(np.interp(min(max(f, 0.0), 1.0), xs, ys))

    def share(self, lo: float, hi: float) -> float:
        """Share of lookups that hit rows in the fraction [lo, hi) of the table."""
        return self.cumulative(hi) - self.cumulative(lo)


def row_share(curve: LookupCurve | None, offset: int, rows: int, table_rows: int) -> float:
    """Share of a table's lookups that hit rows [offset, offset + rows)."""
    if curve is None:
        return rows / table_rows
    return curve.share(offset / table_rows, (offset + rows) / table_rows)


def curves_from_stats(
    configs: list[EmbeddingBagConfig],
    stats: dict[str, dict[str, Any]] | None,
    ids_by_frequency: bool,
) -> dict[str, LookupCurve]:
    """Per table, the curve of its (first) feature when ids are frequency-ordered; none
    otherwise."""
    if not ids_by_frequency or not stats:
        return {}
    out = {}
    for config in configs:
        feature = config.feature_names[0]
        fs = stats.get(feature, {})
        if "top1_share" in fs and "top10_share" in fs:
            top1, top10 = float(fs["top1_share"]), float(fs["top10_share"])
            if not (0.0 <= top1 <= 1.0 and 0.0 <= top10 <= 1.0):
                raise ValueError(
                    f"statistics of {feature}: top1_share {top1} / top10_share {top10} must lie in [0, 1]"
                )
            out[config.name] = LookupCurve(top1, top10)
    return out
