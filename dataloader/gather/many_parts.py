"""Rows of many parts read in one in-order pass: where each row lies, then the columns' kernels.

A shuffle window mixes blocks of ~160-250 parts at Criteo 1TB's part size (~450 K rows).
`PartLocator` finds each row's part and its row inside it (gather_kernels.locate, or through
a coarse index past INDEXED_PARTS parts); the gathering thread's held parts (addresses.py) pack
the two into one key per row; `take_ids_of_parts` then reads every one-hot feature of one id
dtype in one kernel call, from each part's map by data address, straight into the batch's int64
ids. batch.py owns the rest of the gather (labels, dense, the numpy fallbacks).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardrec.dataloader.gather import gather_kernels as kernels
from shardrec.dataloader.gather.addresses import HeldParts, index_dtype

INDEXED_PARTS = 32
"""Past this many parts, rows are located through a coarse index (gather_kernels.locate_indexed)."""
MAX_INDEX_ENTRIES = 1 << 20


def part_index(part_starts: np.ndarray, rows: Sequence[int]) -> tuple[np.ndarray, int] | None:
    """(first_part, shift) for locate_indexed: buckets of 2**shift rows, no larger than the
    smallest non-empty part (a bucket then meets at most two parts, a step past the first)
    unless that would need more than MAX_INDEX_ENTRIES buckets; None for few parts."""
    total = int(part_starts[-1])
    if len(rows) <= INDEXED_PARTS or total == 0:
        return None
    smallest = min(r for r in rows if r)
    shift = max(smallest.bit_length() - 1, ((total - 1) // MAX_INDEX_ENTRIES).bit_length())
    starts = np.arange(((total - 1) >> shift) + 1, dtype=np.int64) << shift
    first_part = np.searchsorted(part_starts, starts, side="right") - 1
    return first_part.astype(np.int64), shift


class PartLocator:
    """Each global row's part and row inside it, for the parts of one split."""

    def __init__(self, part_starts: np.ndarray, rows: Sequence[int]) -> None:
        """part_starts: [parts + 1] first global row of each part, then the total; rows: per
        part."""
        self.part_starts = part_starts
        self.parts = len(rows)
        self.index = part_index(part_starts, rows)
        # Read once a gather to pack the keys (addresses.pack_keys): the narrowest dtypes.
        self.part_dtype = index_dtype(self.parts)
        self.local_dtype = np.int32 if max(rows) <= 1 << 31 else np.int64

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(part_of, local): row k's part and its index inside that part."""
        n = len(rows)
        part_of, local = np.empty(n, self.part_dtype), np.empty(n, self.local_dtype)
        if self.index is None:
            kernels.locate(rows, self.part_starts, part_of, local)
        else:
            kernels.locate_indexed(rows, self.part_starts, *self.index, part_of, local)
        return part_of, local


def take_ids_of_parts(
    held: HeldParts,
    features: list[int],
    modulos: list[int],
    keys: tuple[np.ndarray, int],
    values: np.ndarray,
    pos: int = 0,
) -> np.ndarray:
    """Ids of the one-hot features `features` (their columns: held's columns 2 + f) into
    values[:, f, :] from gather position `pos` on, one kernel call per id dtype, from the rows of
    packed `keys` (keys, shift); the largest id read per feature (uint64, unfolded), for the
    bounds check."""
    highest = np.zeros(len(features), np.uint64)
    for ks, like, columns, strides, feature_ids, folds in held.layout.id_calls(features, modulos):
        out = np.empty(len(ks), np.uint64)
        kernels.take_ids_columns_parts(
            like, held.addresses, columns, strides, feature_ids, folds, *keys, values, pos, out
        )
        highest[ks] = out
    return highest
