"""Host memory of a managed table's id map, on every rank (each holds a replica): what the planner
adds to every rank's estimate (CPU: the rank's memory; CUDA: host memory).

Per slot, preallocated (id_map.IdMap): the slot's id, count, last step and generation (4 x 8 B),
this rank's hits and last step since the update (2 x 8 B), and the index (a power of two at least
twice the slots, 12 B a cell: 24-48 B a slot). Growing with the data, bounded by the settings:
the waiting ids (24 B each, at most `candidates` per slot) and the ids this rank missed since the
last update (a table of 24 B cells at most half full; at most the ids it remaps in a window), and
at an update the every rank's misses gathered and merged (24 B each, twice).
"""

from __future__ import annotations

import dataclasses

from shardrec.embeddings.managed.map_kernels import capacity_for
from shardrec.embeddings.managed.table_kinds import MAPPED_KINDS, TableSettings

SLOT_BYTES = 4 * 8 + 2 * 8
"""Per slot: id, count, last step, generation; this rank's hits and last step."""
INDEX_CELL_BYTES = 8 + 4
ENTRY_BYTES = 3 * 8
"""A waiting or missed id: the id, its count, its last step."""


def id_map_bytes(settings: TableSettings, ids_per_window: float, world_size: int) -> int:
    """Bytes one rank holds for the id map of a table of `settings`, at its largest: with
    `ids_per_window` ids remapped by the rank between two updates (its local batch x the feature's
    ids per sample x the cadence). 0 for a table without a map (static, hashed)."""
    if settings.kind not in MAPPED_KINDS:
        return 0
    rows = settings.rows
    waiting = max(1, int(settings.candidates * rows))
    missed = int(min(ids_per_window, waiting))
    fixed = rows * SLOT_BYTES + capacity_for(rows) * INDEX_CELL_BYTES
    # the waiting ids: kept, then gathered and merged at an update (twice)
    waiting_bytes = 3 * waiting * ENTRY_BYTES
    return int(fixed + waiting_bytes + _missed_bytes(missed, world_size))


def _missed_bytes(missed: int, world_size: int) -> int:
    """The ids a rank missed between two updates: their table, then every rank's at an update."""
    return capacity_for(missed) * ENTRY_BYTES + 2 * world_size * missed * ENTRY_BYTES


def id_map_slot_bytes(settings: TableSettings) -> float:
    """The most bytes one more slot adds to a rank's id map of `settings`, missed ids aside: its
    state, up to 4 index cells (a power of two under 4x the slots) and `candidates` waiting ids
    (kept, gathered, merged); 168 B with candidates = 1."""
    if settings.kind not in MAPPED_KINDS:
        return 0.0
    return SLOT_BYTES + 4 * INDEX_CELL_BYTES + 3 * settings.candidates * ENTRY_BYTES


def id_map_floor_bytes(settings: TableSettings, ids_per_window: float, world_size: int) -> int:
    """What a rank's id map of `settings` holds whatever its slots: id_map_bytes of R slots is at
    most this + R x id_map_slot_bytes (the planner's row budgets price a slot so)."""
    if settings.kind not in MAPPED_KINDS:
        return 0
    one_slot = id_map_bytes(dataclasses.replace(settings, rows=1), 0, world_size)
    return one_slot - _missed_bytes(0, world_size) + _missed_bytes(int(ids_per_window), world_size)
