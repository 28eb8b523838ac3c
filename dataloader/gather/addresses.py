"""Held parts and their column addresses, for the kernels that read rows of several parts in one
pass.

gather_kernels.py's `*_parts` kernels read each row from its part's map by data address and
row stride, the part named by its slot among the parts the gathering thread holds
(`HeldParts`), packed with the row inside it into one key per row (gather_kernels.locate_keys).
Parts may be unmapped and mapped again (part_cache.py): a thread holds the Part objects whose
addresses its tables have, so they stay mapped while it reads them, and starts again when the
PartSet unmapped any part.
"""

from __future__ import annotations

import numpy as np

from shardrec.dataloader.format.part_file import DENSE, LABEL, Part
from shardrec.dataloader.gather.gather_kernels import UNHELD


def index_dtype(count: int) -> type:
    """The narrowest dtype that holds indices 0 .. count - 1 (the kernels read part indices
    once per column and row, so their bytes count)."""
    if count <= 1 << 8:
        return np.uint8
    if count <= 1 << 16:
        return np.uint16
    if count <= 1 << 31:
        return np.int32
    return np.int64


def _columns(part: Part, feature_names: list[str]) -> list[np.ndarray]:
    """The one-hot columns the kernels read, in table order: labels, dense, then each feature."""
    return [part.labels, part.dense, *(part.sparse[n] for n in feature_names)]


class ColumnLayout:
    """The column layout the several-parts kernels take, read once from a reference part: per
    column its dtype (`like`), row stride and whether numba can read it, and the bits a key gives
    to the row inside a part."""

    def __init__(self, feature_names: list[str], reference: Part, rows: int) -> None:
        """rows: the largest part's rows (they size the row field of a key)."""
        self.feature_names = list(feature_names)
        cols = _columns(reference, self.feature_names)
        # The kernels take one row stride per column for all parts: a part whose layout differs
        # goes part by part (numpy), as one of another dtype does.
        self.columns = [(c.dtype, c.strides) for c in cols]
        self.like = [np.empty(0, c.dtype) for c in cols]
        """Per column, an empty array of its dtype (the kernels' type argument)."""
        self.strides = np.array([c.strides[0] for c in cols], np.int64)
        """Per column, the row stride every usable part has."""
        # numba cannot convert float16; such a column goes part by part with numpy.
        self.kernel_ok = np.array([c.dtype != np.float16 for c in cols], bool)
        self.shift = max(int(rows) - 1, 1).bit_length()
        self._id_calls: dict[tuple, list[tuple]] = {}

    def id_calls(self, features: list[int], modulos: list[int]) -> list[tuple]:
        """The several-parts ids kernel's calls for one-hot features `features` (folded by
        `modulos`), one per id dtype and row stride: (positions in `features`, the dtype's empty
        array, columns, row stride, its keys' byte shift (gather_kernels.byte_keys), features,
        modulos). The same for every window of a stream: made once."""
        key = (tuple(features), tuple(modulos))
        calls = self._id_calls.get(key)
        if calls is None:
            by_kind: dict[tuple, list[int]] = {}
            for k, f in enumerate(features):
                by_kind.setdefault((self.like[f + 2].dtype, int(self.strides[f + 2])), []).append(k)
            calls = self._id_calls[key] = [
                (
                    ks,
                    self.like[features[ks[0]] + 2],
                    np.array([features[k] + 2 for k in ks], np.int64),
                    stride,
                    self.byte_shift(stride),
                    np.array([features[k] for k in ks], np.int64),
                    np.array([modulos[k] for k in ks], np.int64),
                )
                for (_, stride), ks in by_kind.items()
            ]
        return calls

    def byte_shift(self, stride: int) -> int:
        """Bits of a row's byte offset in a column of row stride `stride`."""
        return max(((1 << self.shift) - 1) * stride, 1).bit_length()

    def matches(self, part: Part) -> list[bool]:
        """Per column, whether `part`'s has this layout."""
        cols = _columns(part, self.feature_names)
        return [(c.dtype, c.strides) == lay for c, lay in zip(cols, self.columns)]


class HeldParts:
    """The parts one thread's gathers hold, by slot, with each column's data address per slot.

    A shuffle window at Criteo 1TB's part size reads ~160-250 parts, and a group's windows read
    the same ones: holding them (and reading their addresses) once per group, not once per
    gather, took the per-part Python out of the windows (it was ~10% of the stream at 10,000
    parts). The set starts again whenever the PartSet unmapped a part (`PartSet.generation`:
    the stream left a group, or a bound evicted), so it keeps alive no more than the set
    itself maps, plus the parts of the gathers in flight."""

    def __init__(
        self, layout: ColumnLayout, part_starts: np.ndarray, bucket_parts: np.ndarray
    ) -> None:
        """part_starts: the split's [parts + 1] first global row of each part, then the total;
        bucket_parts: the two parts each bucket of rows meets (many_parts.KeyBuckets.parts)."""
        self.layout = layout
        self._part_starts = part_starts[:-1]
        self.key_base = np.full(len(self._part_starts), UNHELD, np.int64)
        """Per part, its row 0's key less its first global row (UNHELD: not held), so that a
        global row plus its part's base is its key."""
        self._bucket_parts = bucket_parts
        self.bases = np.full(bucket_parts.shape, UNHELD, np.int64)
        """key_base of the two parts of each bucket (gather_kernels.locate_keys)."""
        self.held: list[Part] = []
        self._indices: list[int] = []
        self.addresses = np.zeros((len(layout.columns), 256), np.int64)
        self.same = layout.kernel_ok.copy()
        """Per column, whether the kernels may read it from every held part."""
        self.generation = -1

    def start_again(self, generation: int) -> None:
        """Hold nothing from here on (the parts may be unmapped once no gather in flight holds
        them); `generation`: the PartSet's, now."""
        self.key_base[self._indices] = UNHELD
        self.bases.fill(UNHELD)
        self.held, self._indices = [], []
        self.same = self.layout.kernel_ok.copy()
        self.generation = generation

    def add(self, indices: list[int], parts: list[Part]) -> None:
        """Hold parts `indices` (`parts`, their mapped objects), each in the next slot."""
        n = len(self.held)
        if n + len(parts) > self.addresses.shape[1]:
            grown = np.zeros((len(self.layout.columns), 2 * (n + len(parts))), np.int64)
            grown[:, :n] = self.addresses[:, :n]
            self.addresses = grown
        keys = (LABEL, DENSE, *self.layout.feature_names)
        for k, (i, part) in enumerate(zip(indices, parts), start=n):
            self.addresses[:, k] = [
                part.column_address(key, c)
                for key, c in zip(keys, _columns(part, self.layout.feature_names))
            ]
            self.same &= self.layout.matches(part)
            self.key_base[i] = (k << self.layout.shift) - int(self._part_starts[i])
        self.held.extend(parts)
        self._indices.extend(indices)
        np.take(self.key_base, self._bucket_parts, out=self.bases)

    def key_dtype(self, shift: int | None = None) -> type:
        """The keys' dtype for the parts held now, `shift` bits (default: the layout's) below the
        slot: 4 bytes a row where slot and row fit (10,000 parts of 450 K rows: 19 bits of row and
        a group's ~256 slots); the kernels read a key once per value."""
        bits = self.layout.shift if shift is None else shift
        return np.uint32 if bits + max(len(self.held) - 1, 1).bit_length() <= 32 else np.int64
