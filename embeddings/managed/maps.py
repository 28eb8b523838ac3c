"""A job's raw-id tables together: which features they serve, when their id maps update, and
raw ids -> rows for each (torch-free; trainer.loop.managed_ids drives it over batches and
ranks).

Updates are due at fixed steps of a stretch (the data of one `shardrec train` invocation of a run
that goes on; a run that never continues is one stretch): every `cadence` steps from the
stretch's first step, and at the first step of every stretch after the first (so the ids met late
in yesterday's data get their slots before today's first batch). The schedule depends on the
steps only, never on the world size.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from shardrec.embeddings.managed import map_kernels as kernels
from shardrec.embeddings.managed.id_map import IdMap, Pending
from shardrec.embeddings.managed.map_update import UpdateResult, UpdateRule, apply_update
from shardrec.embeddings.managed.table_kinds import FIRST_SLOT_ROW, MAPPED_KINDS, TableSettings


@dataclass
class ManagedTable:
    """One raw-id feature's table: its settings, and its id map (none for a hashed table)."""

    feature: str
    table: str
    """The embedding table's name."""
    settings: TableSettings
    idmap: IdMap | None

    @property
    def rule(self) -> UpdateRule:
        s = self.settings
        return UpdateRule(
            admit=s.admit,
            policy=s.policy,
            evicts=s.evicts,
            capacity=max(1, int(s.candidates * s.rows)),
            decay=s.decay,
        )


@dataclass
class Stretches:
    """The first step of every stretch so far (the last one is the current stretch) and the
    current stretch's length in steps."""

    starts: list[int] = field(default_factory=lambda: [0])
    steps: int = 0

    @property
    def index(self) -> int:
        return len(self.starts) - 1

    @property
    def start(self) -> int:
        return self.starts[-1]


class ManagedMaps:
    """Every raw-id table of a job (feature -> ManagedTable, in the job's feature order)."""

    def __init__(self, tables: list[ManagedTable]) -> None:
        self.tables = {t.feature: t for t in tables}
        self.stretches = Stretches()

    @property
    def mapped(self) -> list[ManagedTable]:
        """The tables with an id map (managed, unbounded), in order."""
        return [t for t in self.tables.values() if t.idmap is not None]

    def begin_stretch(self, start: int, steps: int) -> None:
        """The run's data changes at step `start` (a new stretch of `steps` steps)."""
        if start != self.stretches.start:
            self.stretches.starts.append(start)
        self.stretches.steps = steps

    def cadence(self, table: ManagedTable) -> int:
        return table.settings.cadence(self.stretches.steps)

    def kept_cadence(self, steps: int) -> str:
        """What a resume that trains its stretch for `steps` steps keeps: the tables without
        evict_every update at 1/50 of the stretch's length as it began (the checkpoint's), so that
        the steps the resume and the uninterrupted run share assign ids alike ("": no spacing
        differs from the one `steps` would give)."""
        kept = self.stretches.steps
        unset = [
            t
            for t in self.mapped
            if not t.settings.evict_every and t.settings.cadence(kept) != t.settings.cadence(steps)
        ]
        if not unset:
            return ""
        every = unset[0].settings.cadence(kept)
        return (
            f"{', '.join(t.feature for t in unset)} (evict_every unset): their maps go on "
            f"updating every {every} step(s), 1/50 of the {kept:,} steps this stretch began with, "
            f"not of the {steps:,} it trains now (the steps a resumed and an uninterrupted run "
            "share assign the same ids); set evict_every to space them otherwise"
        )

    def due(self, step: int) -> list[ManagedTable]:
        """The tables whose maps update before the batch of `step` (0-based: the step it ends is
        step + 1) is remapped."""
        start, index = self.stretches.start, self.stretches.index
        if step == start:
            return self.mapped if index > 0 else []
        if step < start:
            return []
        return [t for t in self.mapped if (step - start) % self.cadence(t) == 0]

    def horizon(self, table: ManagedTable, now: int) -> int | None:
        """Ids last seen before this step lose their slot at an update at `now` (None: no max
        age). N days: ids unseen since the start of the stretch N before the current one."""
        age = table.settings.age
        if age is None:
            return None
        if age.unit == "steps":
            return now - age.amount
        back = self.stretches.index - age.amount
        return self.stretches.starts[back] if back >= 0 else None

    def update(self, table: ManagedTable, pending: Pending, now: int) -> UpdateResult:
        """Apply every rank's combined statistics to one table's map at step `now`."""
        assert table.idmap is not None
        # The stretch's first update is due once (due()): a resume from the checkpoint the stretch
        # began at makes it, one from any later step finds it made, so counts decay once a day.
        new_day = now == self.stretches.start and self.stretches.index > 0
        return apply_update(
            table.idmap, pending, now, table.rule, self.horizon(table, now), new_day
        )

    def rows(
        self, feature: str, keys: np.ndarray, counted: np.ndarray | None, step: int
    ) -> np.ndarray:
        """Table rows of one feature's raw ids (uint64); `counted` (a bool per id) counts them as
        seen at `step` (None: read only, as evaluation and prediction)."""
        table = self.tables[feature]
        if table.idmap is None:
            out = np.empty(len(keys), np.int64)
            kernels.hashed_rows(keys, table.settings.rows, FIRST_SLOT_ROW, out)
            return out
        if counted is None:
            return table.idmap.rows_of(keys)
        return table.idmap.remap(keys, counted, step)


def build_maps(features: dict[str, tuple[str, TableSettings]]) -> ManagedMaps:
    """The maps of a job's raw-id features: feature -> (table name, settings)."""
    return ManagedMaps(
        [
            ManagedTable(
                feature,
                table,
                settings,
                IdMap(settings.rows) if settings.kind in MAPPED_KINDS else None,
            )
            for feature, (table, settings) in features.items()
        ]
    )
