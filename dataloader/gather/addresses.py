"""Per-part column addresses for the kernels that read rows of several parts in one pass.

gather_kernels.py's `*_parts` kernels read each row from its part's map by data address and
row stride. Parts may be unmapped and mapped again (part_cache.py), so the tables are built
per gather for the parts that gather holds, from a per-part cache of addresses that is
refreshed whenever a part comes back as a new mapping.
"""

from __future__ import annotations

import weakref

import numpy as np

from shardrec.dataloader.format.part_file import Part
from shardrec.dataloader.util.jit import njit


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


@njit(cache=True, nogil=True, boundscheck=False)
def compact_parts(part_of, parts, used):
    """Renumber part indices (as gather_kernels.locate wrote them) over the parts they use, in
    place: afterwards part_of[i] indexes `used`, which gets those parts' own indices in order.
    Returns how many parts are used. Two byte-sized passes, a few % of locate's search."""
    number = np.full(parts, -1, np.int64)
    for i in range(part_of.shape[0]):
        number[part_of[i]] = 0
    count = 0
    for p in range(parts):
        if number[p] == 0:
            number[p] = count
            used[count] = p
            count += 1
    for i in range(part_of.shape[0]):
        part_of[i] = number[part_of[i]]
    return count


def _columns(part: Part, feature_names: list[str]) -> list[np.ndarray]:
    """The one-hot columns the kernels read, in table order: labels, dense, then each feature."""
    return [part.labels, part.dense, *(part.sparse[n] for n in feature_names)]


class AddressCache:
    """Data address and row stride of every column of every part seen, by part index.

    Kept in [columns, parts] arrays, so a gather's tables are one fancy index over the parts it
    uses: at Criteo 1TB's part size a 64 K-row gather reads ~160-250 parts, and stacking a small
    array per part for each was a visible share of the gather."""

    def __init__(self, feature_names: list[str], reference: Part, parts: int) -> None:
        self.feature_names = list(feature_names)
        cols = _columns(reference, self.feature_names)
        # The 1-d columns' kernels take one row stride for all parts: a part whose stride differs
        # goes part by part (numpy), as one of another dtype does.
        self._layout = [(c.dtype, c.strides) for c in cols]
        self.like = [np.empty(0, c.dtype) for c in cols]
        """Per column, an empty array of its dtype (the kernels' type argument)."""
        # numba cannot convert float16; such a column goes part by part with numpy.
        self._kernel_ok = np.array([c.dtype != np.float16 for c in cols], bool)
        self._addresses = np.zeros((len(cols), parts), np.int64)
        self._strides = np.zeros((len(cols), parts), np.int64)
        self._usable = np.zeros((len(cols), parts), bool)
        # The part each index's entries were read from: a part unmapped and mapped again is a
        # new object whose columns lie elsewhere (a weak reference: the cache keeps no map alive).
        self._refs: list[weakref.ref | None] = [None] * parts

    def _fill(self, index: int, part: Part) -> None:
        cols = _columns(part, self.feature_names)
        self._addresses[:, index] = [c.ctypes.data for c in cols]
        self._strides[:, index] = [c.strides[0] for c in cols]
        self._usable[:, index] = [(c.dtype, c.strides) == lay for c, lay in zip(cols, self._layout)]
        self._usable[:, index] &= self._kernel_ok
        self._refs[index] = weakref.ref(part)

    def tables(
        self, indices: np.ndarray, held: list[Part]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(addresses, strides) [columns, parts] of the held parts (indices[k] is held[k]'s
        part index), and per column whether the kernels may read it from all of them.

        The caller keeps `held` alive while the kernels use the addresses."""
        refs = self._refs
        for i, part in zip(indices.tolist(), held):
            ref = refs[i]
            if ref is None or ref() is not part:
                self._fill(i, part)
        return (
            self._addresses[:, indices],
            self._strides[:, indices],
            self._usable[:, indices].all(axis=1),
        )
