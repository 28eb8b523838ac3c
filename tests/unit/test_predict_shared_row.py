"""`shardrec predict` with a model of managed tables says, per table, how many of the ids it scored
had no slot in the model's id map (a new day's new items), which it scores through the shared
row: on a drifting log that may be most of a day's lookups, and nothing said so."""

from __future__ import annotations

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shardrec.dataloader.format.raw_ids import MISSING_KEY
from shardrec.embeddings.managed.map_kernels import EMPTY
from shardrec.embeddings.managed.maps import build_maps
from shardrec.embeddings.managed.table_kinds import TableSettings
from shardrec.trainer.inference.shared_row import shared_row_lines, shared_row_lookups
from shardrec.trainer.loop.managed_ids import remap_batch


def _batch(item: list[int], genres: list[list[int]], labels: list[int]) -> Batch:
    """Raw ids: one item per row, a list of genres per row; label -1 marks a padding row."""
    values = [*item, *(g for row in genres for g in row)]
    lengths = [1] * len(item) + [len(row) for row in genres]
    return Batch(
        dense_features=torch.zeros(len(item), 1),
        sparse_features=KeyedJaggedTensor.from_lengths_sync(
            keys=["item", "genres"],
            values=torch.from_numpy(np.array(values, np.uint64).view(np.int64)),
            lengths=torch.tensor(lengths, dtype=torch.int32),
        ),
        labels=torch.tensor(labels),
    )


def test_predict_counts_per_table_the_ids_scored_through_the_shared_row():
    maps = build_maps(
        {
            "item": ("t_item", TableSettings(kind="managed", rows=4)),
            "genres": ("t_genres", TableSettings(kind="unbounded", rows=3)),
            "site": ("t_site", TableSettings(kind="hashed", rows=8)),  # no map, no shared row
        }
    )
    for feature, slots in (("item", [11, 12, EMPTY, EMPTY]), ("genres", [5, 6, 7])):
        idmap = maps.tables[feature].idmap
        idmap.slot_key[:] = np.array(slots, np.uint64)
        idmap.rebuild_index()
    lookups = shared_row_lookups(maps)
    # Row 2 has a new item and a missing one's key is no id; row 4 is padding, not scored.
    items = [11, 99, MISSING_KEY, 12, 98]
    for batch in (
        _batch(items[:3], [[5, 8], [], [6]], [1, 0, 1]),
        _batch(items[3:], [[9], [9, 9]], [0, -1]),
    ):
        lookups.count(remap_batch(maps, batch, None))
    assert lookups.summary() == {
        "item": {"ids": 3, "shared_row": 1},
        "genres": {"ids": 4, "shared_row": 2},
    }
    assert shared_row_lines(lookups, "m.safetensors") == [
        "m.safetensors: ids with no slot in the model's id maps (first seen after training, seen "
        "fewer than admit_after times, or evicted) were scored through their table's shared row:",
        "  item: 1 of 3 ids (33.3%)",
        "  genres: 2 of 4 ids (50.0%)",
    ]


def test_a_model_without_mapped_tables_says_nothing_of_a_shared_row():
    hashed = build_maps({"site": ("t_site", TableSettings(kind="hashed", rows=8))})
    assert shared_row_lookups(None) is None and shared_row_lookups(hashed) is None
    assert shared_row_lines(None, "m.safetensors") == []
