"""What `predict` says of the ids its managed tables had no slot for.

An exported model's managed (and unbounded) tables score an id that has no slot in the model's id
map through the table's shared row, by design (embeddings/managed): ids first seen after training
(a new day's new items), seen fewer than admit_after times, or evicted. On a drifting log most of a
day's lookups may be such ids, and the AUC predict prints then measures the shared row; it says how
many there were, per table, as it says of rows that never trained (trained_rows.py), which does not
mark managed tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from torchrec.datasets.utils import Batch

from shardrec.embeddings.managed.maps import ManagedMaps
from shardrec.embeddings.managed.table_kinds import MISSING_ROW, SHARED_ROW


@dataclass
class SharedRowLookups:
    """Per feature of a mapped table: the ids scored (missing values left out) and those scored
    through the shared row."""

    features: list[str]
    ids: dict[str, int] = field(default_factory=dict)
    shared: dict[str, int] = field(default_factory=dict)

    def count(self, batch: Batch) -> None:
        """Count a remapped batch's real rows (label >= 0; padding rows are not scored)."""
        kjt = batch.sparse_features
        keys, offsets = kjt.keys(), kjt.offset_per_key()
        rows = kjt.values().numpy()
        lengths = kjt.lengths().numpy().reshape(len(keys), -1)
        real = (batch.labels >= 0).numpy()
        for i, key in enumerate(keys):
            if key not in self.features:
                continue
            looked = rows[offsets[i] : offsets[i + 1]][np.repeat(real, lengths[i])]
            self.ids[key] = self.ids.get(key, 0) + int((looked != MISSING_ROW).sum())
            self.shared[key] = self.shared.get(key, 0) + int((looked == SHARED_ROW).sum())

    def summary(self) -> dict[str, dict[str, int]]:
        """Per feature: {"ids": scored, "shared_row": without a slot} (predict's --json)."""
        return {
            f: {"ids": self.ids.get(f, 0), "shared_row": self.shared.get(f, 0)}
            for f in self.features
        }


def shared_row_lookups(maps: ManagedMaps | None) -> SharedRowLookups | None:
    """The counter of a model's mapped tables (None: it has none)."""
    features = [t.feature for t in maps.mapped] if maps is not None else []
    return SharedRowLookups(features) if features else None


def shared_row_lines(lookups: SharedRowLookups | None, model: str) -> list[str]:
    """One line, then one per feature that had any: the ids scored through the shared row."""
    if lookups is None:
        return []
    hit = {f: c for f, c in lookups.summary().items() if c["shared_row"]}
    if not hit:
        return []
    lines = [
        f"{model}: ids with no slot in the model's id maps (first seen after training, seen "
        "fewer than admit_after times, or evicted) were scored through their table's shared row:"
    ]
    lines += [
        f"  {f}: {c['shared_row']:,} of {c['ids']:,} ids ({c['shared_row'] / c['ids']:.1%})"
        for f, c in hit.items()
    ]
    return lines
