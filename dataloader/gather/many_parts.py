"""Rows of many parts read in one in-order pass: where each row lies, then the columns' kernels.

A shuffle window mixes blocks of ~160-250 parts at Criteo 1TB's part size (~450 K rows).
`PartLocator` gives each row its key among the gathering thread's held parts (addresses.py): its
slot and its row inside the part in one integer, through a table of buckets of rows
(`KeyBuckets`, gather_kernels.locate_keys); where the numpy paths need each row's part and row
inside it, it finds them (gather_kernels.locate, or through a coarse index past INDEXED_PARTS
parts). `take_ids_of_parts` then reads every one-hot feature of one id dtype in one kernel call,
from each part's map by data address, straight into the batch's int64 ids. batch.py owns the
rest of the gather (labels, dense, the numpy fallbacks).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardrec.dataloader.gather import gather_kernels as kernels
from shardrec.dataloader.gather.addresses import HeldParts, index_dtype

INDEXED_PARTS = 32
"""Past this many parts, rows are located through a coarse index (gather_kernels.locate_indexed)."""
MAX_INDEX_ENTRIES = 1 << 20


def bucket_shift(total: int, rows: Sequence[int]) -> int:
    """Buckets of 2**shift rows, no larger than the smallest non-empty part (a bucket then meets
    at most two parts) unless that would need more than MAX_INDEX_ENTRIES buckets."""
    smallest = min(r for r in rows if r)
    return max(smallest.bit_length() - 1, ((total - 1) // MAX_INDEX_ENTRIES).bit_length())


def part_index(part_starts: np.ndarray, rows: Sequence[int]) -> tuple[np.ndarray, int] | None:
    """(first_part, shift) for locate_indexed: the part holding each bucket's first row
    (`bucket_shift`: a bucket meets at most two parts, a step past the first, where no part is
    smaller than a bucket); None for few parts."""
    total = int(part_starts[-1])
    if len(rows) <= INDEXED_PARTS or total == 0:
        return None
    shift = bucket_shift(total, rows)
    starts = np.arange(((total - 1) >> shift) + 1, dtype=np.int64) << shift
    first_part = np.searchsorted(part_starts, starts, side="right") - 1
    return first_part.astype(np.int64), shift


class KeyBuckets:
    """The parts each bucket of rows meets, for gather_kernels.locate_keys: the part of its first
    row (`parts[b, 0]`), the part of its last (`parts[b, 1]`) and where that one starts
    (`second_start`: past the bucket's rows where both are one part, -1 where the bucket meets
    more than two non-empty parts, whose rows are then searched)."""

    def __init__(self, part_starts: np.ndarray, rows: Sequence[int]) -> None:
        total = int(part_starts[-1])
        self.shift = bucket_shift(total, rows) if total else 0
        first = np.arange(((max(total, 1) - 1) >> self.shift) + 1, dtype=np.int64) << self.shift
        last = np.minimum(first + (1 << self.shift) - 1, max(total - 1, 0))

        def part_of(r: np.ndarray) -> np.ndarray:
            return np.minimum(np.searchsorted(part_starts, r, side="right") - 1, len(rows) - 1)

        self.parts = np.stack([part_of(first), part_of(last)], axis=1)
        one, two = self.parts[:, 0], self.parts[:, 1]
        boundary = part_starts[two]
        # Two parts: nothing but empty parts between them (the row before the second's start is
        # the first's).
        self.second_start = np.where(
            one == two, total, np.where(part_of(boundary - 1) == one, boundary, -1)
        ).astype(np.int64)


class PartLocator:
    """Each global row's part and row inside it, for the parts of one split."""

    def __init__(self, part_starts: np.ndarray, rows: Sequence[int]) -> None:
        """part_starts: [parts + 1] first global row of each part, then the total; rows: per
        part."""
        self.part_starts = part_starts
        self.parts = len(rows)
        self.index = part_index(part_starts, rows)
        self.buckets = KeyBuckets(part_starts, rows)
        # The narrowest dtypes, for the numpy paths' grouping by part.
        self.part_dtype = index_dtype(self.parts)
        self.local_dtype = np.int32 if max(rows) <= 1 << 31 else np.int64

    def keys(self, rows: np.ndarray, held: HeldParts, hold) -> tuple[np.ndarray, int]:
        """Packed keys of global rows among the parts `held` holds (addresses.HeldParts) and
        their shift, holding the parts not held yet through `hold(indices) -> parts`."""
        keys = np.empty(len(rows), held.key_dtype())
        if self._keys(rows, held, keys):
            part_of, _ = self.locate(rows)
            missing = np.unique(part_of[held.key_base[part_of] == kernels.UNHELD]).tolist()
            held.add(missing, hold(missing))
            if held.key_dtype() != keys.dtype:
                keys = np.empty(len(rows), held.key_dtype())
            self._keys(rows, held, keys)
        return keys, held.layout.shift

    def _keys(self, rows: np.ndarray, held: HeldParts, keys: np.ndarray) -> int:
        b = self.buckets
        return kernels.locate_keys(
            rows, self.part_starts, b.shift, b.second_start, held.bases, held.key_base, keys
        )

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
    values[:, f, :] from gather position `pos` on, one kernel call per id dtype and row stride,
    from the rows of packed `keys` (keys, shift); the largest id read per feature (uint64,
    unfolded), for the bounds check."""
    highest = np.zeros(len(features), np.uint64)
    rows, shift = keys
    for ks, like, columns, stride, byte_shift, feature_ids, folds in held.layout.id_calls(
        features, modulos
    ):
        if stride == 1:  # the row is its byte offset
            offsets = rows
        else:
            offsets = np.empty(len(rows), held.key_dtype(byte_shift))
            kernels.byte_keys(rows, shift, stride, byte_shift, offsets)
        out = np.empty(len(ks), np.uint64)
        kernels.take_ids_columns_parts(
            like, held.addresses, columns, feature_ids, folds, offsets, byte_shift, values, pos, out
        )
        highest[ks] = out
    return highest
