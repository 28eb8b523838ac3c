"""Raw categorical values -> embedding row ids, by hashing or by a frequency-cut vocabulary.

Id 0 is reserved for a missing value in both modes, so an empty field never shares a row
with the real value `00000000`.

- Hashing (`--max-ids N`): id = 1 + mix64(value) mod (N - 1); one pass, no state. mix64 is
  splitmix64's finalizer (dataloader.util.splitmix), so neighbouring raw values spread over the table.
- Vocabulary (`--min-count K`): values seen at least K times in the training days get ids
  2, 3, ... in order of decreasing count (ties by value), so hot rows sit together; id 1 is
  the out-of-vocabulary id for values unseen or seen fewer than K times.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from shardrec.dataloader.format.raw_ids import MISSING_KEY
from shardrec.dataloader.util.splitmix import MIX_M1, MIX_M2, mix64

MISSING_ID = 0
OOV_ID = 1
BUCKET_VALUES = (
    32  # kept values per bucket of the compiled lookup's index, on average: 1/8 byte per value
)


def hash_bytes(data: bytes) -> int:
    """The 64-bit value of a string categorical (spec_values.hash_string, in Python): its bytes in
    big-endian words of 8 (the last one shorter), h = mix64(h ^ word) from 0, then mix64(h ^
    length). Ids come from it as from a hex value: hash_ids."""
    mask = (1 << 64) - 1

    def mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * int(MIX_M1)) & mask
        z = ((z ^ (z >> 27)) * int(MIX_M2)) & mask
        return z ^ (z >> 31)

    h = 0
    for k in range(0, len(data), 8):
        h = mix(h ^ int.from_bytes(data[k : k + 8], "big"))
    return mix(h ^ len(data))


def hash_ids(values: np.ndarray, missing: np.ndarray, cardinality: int) -> np.ndarray:
    """uint64 ids in [0, cardinality): 0 for missing, 1 + hash mod (cardinality - 1) otherwise; a
    raw-id feature (cardinality 0) keeps its values, MISSING_KEY for missing (format.raw_ids)."""
    if cardinality == 0:
        ids = values.astype(np.uint64, copy=True)
        ids[missing] = np.uint64(MISSING_KEY)
        return ids
    if cardinality < 2:
        raise ValueError(
            f"hashing needs a cardinality of at least 2 (id 0 is the missing value), got {cardinality}"
        )
    ids = mix64(values) % np.uint64(cardinality - 1) + np.uint64(1)
    ids[missing] = MISSING_ID
    return ids


def count_values(values: np.ndarray, missing: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct present values of one column and how often each occurs (sorted by value):
    np.unique's result, but sorted in place, in 32 bits where the values fit (Criteo's hex): the
    faster sort."""
    present = values[~missing]  # a copy: sorted in place
    if not len(present):
        return present.astype(np.uint64), np.zeros(0, np.int64)
    if not int(present.max()) >> 32:
        present = present.astype(np.uint32)
    present.sort()
    starts = np.flatnonzero(np.concatenate(([True], present[1:] != present[:-1])))
    return present[starts].astype(np.uint64), np.diff(np.append(starts, len(present)))


def merge_counts(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Sum (values, counts) pairs from several chunks into one sorted pair."""
    if not parts:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    values = np.concatenate([p[0] for p in parts]).astype(np.uint64, copy=False)
    counts = np.concatenate([p[1] for p in parts]).astype(np.int64, copy=False)
    order = np.argsort(values, kind="stable")
    values, counts = values[order], counts[order]
    uniq, first = np.unique(values, return_index=True)
    return uniq, np.add.reduceat(counts, first) if len(values) else counts


@dataclass
class Vocabulary:
    """One feature's kept values (sorted, for lookups) and the id each maps to.

    The arrays may be memory-mapped (vocab.load_vocabularies): lookups only read them."""

    sorted_values: np.ndarray  # uint64 or uint32 [n]
    ids: np.ndarray  # uint64 or uint32 [n], the id of sorted_values[i]

    @cached_property
    def bucket_starts(self) -> tuple[np.ndarray, int]:
        """(starts, shift): the values v with v >> shift == b are sorted_values[starts[b]:starts[b +
        1]], about BUCKET_VALUES of them (the compiled lookup's index, per worker: 52 M kept values,
        the worst case, take ~6.5 MB)."""
        n = len(self.sorted_values)
        top = int(self.sorted_values[-1]) if n else 0
        bits = max(0, (n // BUCKET_VALUES).bit_length())
        shift = max(0, top.bit_length() - bits)  # top >> shift < 2**bits buckets
        bounds = np.arange((top >> shift) + 1, dtype=np.uint64) << np.uint64(shift)
        starts = np.empty(len(bounds) + 1, np.int64 if n >= 2**32 else np.uint32)
        starts[:-1] = np.searchsorted(self.sorted_values, bounds.astype(self.sorted_values.dtype))
        starts[-1] = n
        return starts, shift

    @property
    def cardinality(self) -> int:
        return len(self.sorted_values) + 2

    @classmethod
    def build(cls, values: np.ndarray, counts: np.ndarray, min_count: int) -> Vocabulary:
        keep = counts >= min_count
        kv, kc = values[keep], counts[keep]
        # Rank by decreasing count, ties by value: deterministic whatever the counting order.
        rank = np.lexsort((kv, -kc))
        ids = np.empty(len(kv), dtype=np.uint64)
        ids[rank] = np.arange(2, len(kv) + 2, dtype=np.uint64)
        return cls(kv.astype(np.uint64), ids)

    def lookup(self, values: np.ndarray, missing: np.ndarray) -> np.ndarray:
        """uint64 ids of uint64 values: MISSING_ID where `missing`, OOV_ID where not kept."""
        table = self.sorted_values
        too_big = None
        if (
            table.dtype.itemsize < values.dtype.itemsize
        ):  # a narrow table: search in its dtype (numpy would cast the table)
            too_big = values > np.iinfo(table.dtype).max
            values = np.where(too_big, 0, values).astype(table.dtype)
        pos = np.searchsorted(table, values)
        pos_c = np.minimum(pos, max(len(table) - 1, 0))
        if len(table):
            found = table[pos_c] == values
            if too_big is not None:
                found &= ~too_big
            out = np.where(found, self.ids[pos_c], OOV_ID).astype(np.uint64, copy=False)
        else:
            out = np.full(values.shape, OOV_ID, dtype=np.uint64)
        out[missing] = MISSING_ID
        return out
