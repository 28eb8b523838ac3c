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
    growing = waiting * ENTRY_BYTES + capacity_for(missed) * ENTRY_BYTES
    update = 2 * (waiting + world_size * missed) * ENTRY_BYTES
    return int(fixed + growing + update)
