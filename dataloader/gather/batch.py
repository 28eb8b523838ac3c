"""Turn global row indices into a torchrec `Batch`: compiled or numpy gathers, no per-row Python.

Per batch the work is one gather per column (memory-mapped, so only the rows asked for are read),
written straight into a preallocated int64 values array for all sparse features, and one
`torch.from_numpy` per tensor. The labels, dense rows and one-hot ids are written into the memory of
batches the consumer has let go of (batch_memory.py). The
gathers are the numba kernels of gather_kernels.py (one pass: read, cast, write in place; rows of
several parts in one in-order pass per column); without numba, or with `compiled=False`, numpy's
`np.take` per part plus casting copies do the same (the unit tests hold both to identical batches).
Consecutive rows (no shuffle) are copied as slices either way. The column reads themselves, over
one part or many, are columns.py's; kjts.py makes the KeyedJaggedTensors. A shuffled stream is
gathered in spans of whole shuffle windows (`gather_span`, dataloader/window_spans.py).
"""

from __future__ import annotations

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shardrec.dataloader.format.integrity import (
    bad_jagged_id_error,
    bad_label_error,
    check_list_rows,
)
from shardrec.dataloader.gather import gather_kernels as kernels
from shardrec.dataloader.gather.columns import ColumnReader, positions
from shardrec.dataloader.gather.row_groups import (
    Groups,
    consecutive,
    group_rows,
    jagged_values,
)

PAD_LABEL = -1.0
"""Label of padding rows (tail="pad"): the trainer masks label < 0 out of loss and metrics."""


class BatchGatherer(ColumnReader):
    """Reads rows of a split (a list of memory-mapped parts) into torchrec Batches."""

    def gather(self, rows: np.ndarray, real: int | None = None) -> Batch:
        """Batch of the given global rows, in order; rows at positions >= `real` get PAD_LABEL."""
        return self.gather_many([(rows, len(rows) if real is None else real)])[0]

    def gather_many(self, slices: list[tuple[np.ndarray, int]]) -> list[Batch]:
        """Batches of several equal-sized row slices, each with its count of real rows.

        One gather per column serves all of them: consecutive batches come from the same
        shuffle window, so each column's slice of the window is read while it is in cache.
        """
        b, count = len(slices[0][0]), len(slices)
        assert all(len(r) == b for r, _ in slices), "slices must have equal sizes"
        rows = slices[0][0] if count == 1 else np.concatenate([r for r, _ in slices])
        n = count * b
        first_last = self._part_range(rows)
        if self.compiled and not self.multi_hot:
            first, last = first_last
            if first == last:
                labels, dense, values = self._gather_one_part(rows, first, count, b, 0)
            elif consecutive(rows):
                return self._batches(slices, *self._gather_consecutive(rows, first_last, count, b))
            else:
                labels, dense, values = self._gather_located(rows, count, b)
            return self._batches(slices, labels, dense, self.kjts.one_hot(values, b))
        groups = group_rows(rows, self._part_starts, first_last, self.compiled)
        labels, dense = self.memory.labels_dense(n)
        labels = self._column(groups, n, lambda p: p.labels, labels)
        dense = self._column(groups, n, lambda p: p.dense, dense)
        if self.multi_hot:
            kjts = [
                self.kjts.make(
                    *self._jagged(
                        group_rows(r, self._part_starts, self._part_range(r), self.compiled), b, r
                    ),
                    b,
                )
                for r, _ in slices
            ]
        else:
            values = self.memory.ids(count, b)  # numpy, part by part (compiled went above)
            for f, name in enumerate(self.feature_names):
                taken = self._take(groups, n, lambda p, name=name: p.sparse[name])
                values[:, f, :] = taken.reshape(count, b)
                self._check_ids(name, values[:, f, :], rows, source=taken)
                if name in self.modulo:
                    np.remainder(values[:, f, :], self.modulo[name], out=values[:, f, :])
            kjts = self.kjts.one_hot(values, b)
        return self._batches(slices, labels, dense, kjts)

    def _batches(
        self,
        slices: list[tuple[np.ndarray, int]],
        labels: np.ndarray,
        dense: np.ndarray,
        kjts: list[KeyedJaggedTensor],
    ) -> list[Batch]:
        """Cut the gathered columns into one Batch per slice; padding rows get PAD_LABEL.

        A label other than 0 and 1 (a part file changed since preprocessing wrote it) is refused
        here, as an id outside its table is: trained on, it would pass silently (a negative one,
        which a torchrec npy day's int32 labels can hold, as a padding row left out of the loss)."""
        if len(labels) and (labels.max() > 1 or labels.min() < 0):
            rows = np.concatenate([r for r, _ in slices])
            raise bad_label_error(self.parts, self._part_starts, rows)
        return self._build(labels, dense, kjts, [real for _, real in slices], len(slices[0][0]))

    def _build(
        self,
        labels: np.ndarray,
        dense: np.ndarray,
        kjts: list[KeyedJaggedTensor],
        reals: list[int],
        b: int,
    ) -> list[Batch]:
        """One Batch per KeyedJaggedTensor, batch i holding rows i * b .. (i + 1) * b of labels and
        dense; its rows from reals[i] on are padding (PAD_LABEL)."""
        for i, real in enumerate(reals):
            if real < b:
                labels[i * b + real : (i + 1) * b] = PAD_LABEL
        return [
            Batch(
                dense_features=torch.from_numpy(dense[i * b : (i + 1) * b]),
                sparse_features=kjts[i],
                labels=torch.from_numpy(labels[i * b : (i + 1) * b]),
            )
            for i in range(len(kjts))
        ]

    def _gather_consecutive(
        self, rows: np.ndarray, first_last: tuple[int, int], count: int, b: int
    ):
        """Labels, dense and one-hot ids of consecutive rows over several parts (no shuffle): each
        part's run copied as slices, its ids by copy_ids, as for rows of one part."""
        n = count * b
        first, last = first_last
        starts = self._part_starts
        numbers = [p for p in range(first, last + 1) if starts[p + 1] > starts[p]]  # not empty
        held = self._hold(numbers)
        labels, dense = self.memory.labels_dense(n)
        values = self.memory.ids(count, b)
        highest = np.zeros(len(self.feature_names), np.uint64)
        pos = 0
        for p, part in zip(numbers, held):
            start = max(int(rows[0]) - int(starts[p]), 0)
            m = min(part.rows - start, n - pos)
            labels[pos : pos + m] = part.labels[start : start + m]
            dense[pos : pos + m] = part.dense[start : start + m]
            for f, name in enumerate(self.feature_names):
                hi = kernels.copy_ids(part.sparse[name], start, values, f, pos, m)
                highest[f] = max(int(highest[f]), int(hi))
            pos += m
        for f, name in enumerate(self.feature_names):
            if name in self.modulo:
                np.remainder(values[:, f, :], self.modulo[name], out=values[:, f, :])
            else:
                self._check_ids(name, values[:, f, :], rows, int(highest[f]))
        del held  # the parts may be unmapped from here on
        return labels, dense, self.kjts.one_hot(values, b)

    def gather_span(
        self, rows: np.ndarray, start: int, count: int, b: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Labels [count * b], dense rows [count * b, dense] and one-hot ids [count, features, b]
        of `count` batches of b rows, of which gather positions start .. start + len(rows) - 1
        (batch-major) are read from the global `rows`; the others are left unwritten, for the
        caller to fill. Compiled one-hot gathers only.

        The loader reads a shuffled stream in spans of whole shuffle windows this way: a span
        that ends inside a batch leaves that batch's other rows to the next span, so no two
        gathers read rows of one window (one that did read a sparse subset of twice the
        window's cache lines, and the next gather the rest of the same lines again after
        they were evicted: the many-part stream's largest cost, loader.py)."""
        assert self.compiled and not self.multi_hot, "spans are for compiled one-hot gathers"
        n = len(rows)
        first, last = self._part_range(rows)
        if first != last:
            labels, dense, values = self._gather_located(rows, count, b, start)
        else:
            labels, dense, values = self._gather_one_part(rows, first, count, b, start)
        read = labels[start : start + n]
        if n and (read.max() > 1 or read.min() < 0):
            raise bad_label_error(self.parts, self._part_starts, rows)
        return labels, dense, values

    def batches_of(
        self, labels: np.ndarray, dense: np.ndarray, values: np.ndarray, reals: list[int], b: int
    ) -> list[Batch]:
        """The first len(reals) batches of arrays `gather_span` made (and the caller filled):
        batch i's rows from reals[i] on are padding (PAD_LABEL)."""
        return self._build(labels, dense, self.kjts.one_hot(values[: len(reals)], b), reals, b)

    def _gather_one_part(self, rows: np.ndarray, p: int, count: int, b: int, start: int):
        """Labels, dense and one-hot ids (as `gather_span` lays them out) of rows of part p alone:
        the kernels, a gather in shuffled order or a cast copy of consecutive rows."""
        n = len(rows)
        groups = group_rows(rows, self._part_starts, (p, p), True)
        labels, dense = self.memory.labels_dense(count * b)
        self._column(groups, n, lambda q: q.labels, labels[start : start + n])
        self._column(groups, n, lambda q: q.dense, dense[start : start + n])
        values = self.memory.ids(count, b)
        part, span = self.parts[p], groups.spans[0]
        for f, name in enumerate(self.feature_names):
            modulo = self.modulo.get(name, 0)
            if span is None:
                hi = kernels.take_ids(part.sparse[name], groups.local[0], values, f, modulo, start)
            else:  # consecutive rows: a cast copy, folded after
                hi = kernels.copy_ids(part.sparse[name], span[0], values, f, start, n)
                for view in positions(values, f, start, n) if modulo else ():
                    np.remainder(view, modulo, out=view)
            self._check_read_ids(name, values, f, start, rows, hi)
        return labels, dense, values

    def _jagged(self, groups: Groups, n: int, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Values and lengths ([features * n], feature-major) when some features are multi-hot."""
        lengths = np.ones(len(self.feature_names) * n, np.int32)
        pieces = []
        for f, name in enumerate(self.feature_names):
            if name not in self.multi_hot:
                pieces.append(
                    self._column(
                        groups, n, lambda p, name=name: p.sparse[name], np.empty(n, np.int64)
                    )
                )
                self._check_ids(name, pieces[-1], rows)
                continue
            lens = lengths[f * n : (f + 1) * n]
            chunks = [None] * len(groups.parts)
            for i, (p, local, where) in enumerate(zip(groups.parts, groups.local, groups.where)):
                off = self.parts[p].offsets[name]
                starts, ends = np.take(off, local), np.take(off, local + 1)
                check_list_rows(self.parts[p], name, local, starts, ends)
                lens[slice(None) if where is None else where] = ends - starts
                chunks[i] = (self.parts[p].sparse[name], starts, ends - starts)
            pieces.append(jagged_values(groups, chunks, lens))
            limit = self.limits.get(name)
            if limit and len(pieces[-1]) and int(pieces[-1].view(np.uint64).max()) >= limit:
                raise bad_jagged_id_error(self.parts, list(zip(groups.parts, groups.local)), name)
        values = np.concatenate(pieces)
        if self.modulo:
            bounds = np.concatenate(
                [[0], np.cumsum(lengths.reshape(len(self.feature_names), n).sum(axis=1))]
            )
            for f, name in enumerate(self.feature_names):
                if name in self.modulo:
                    seg = values[bounds[f] : bounds[f + 1]]
                    np.remainder(seg, self.modulo[name], out=seg)
        return values, lengths
