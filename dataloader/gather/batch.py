"""Turn global row indices into a torchrec `Batch`: compiled or numpy gathers, no per-row Python.

Per batch the work is one gather per column (memory-mapped, so only the rows asked for are read),
written straight into a preallocated int64 values array for all sparse features, and one
`torch.from_numpy` per tensor. The labels, dense rows and one-hot ids are written into the memory of
batches the consumer has let go of (batch_memory.py). The
gathers are the numba kernels of gather_kernels.py (one pass: read, cast, write in place; rows of
several parts in one in-order pass per column); without numba, or with `compiled=False`, numpy's
`np.take` per part plus casting copies do the same (the unit tests hold both to identical batches).
Consecutive rows (no shuffle) are copied as slices either way. Rows of many parts are located and
their ids read by many_parts.py; the numpy paths go part by part (row_groups.py). kjts.py makes
the KeyedJaggedTensors.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shardrec.dataloader.format.integrity import (
    bad_id_error,
    bad_jagged_id_error,
    bad_label_error,
    check_list_rows,
)
from shardrec.dataloader.format.part_cache import PartSet, part_rows
from shardrec.dataloader.format.part_file import Part
from shardrec.dataloader.gather import gather_kernels as kernels
from shardrec.dataloader.gather.addresses import ColumnLayout, HeldParts
from shardrec.dataloader.gather.batch_memory import BatchMemory
from shardrec.dataloader.gather.kjts import KjtMaker
from shardrec.dataloader.gather.many_parts import PartLocator, take_ids_of_parts
from shardrec.dataloader.gather.row_groups import (
    Groups,
    consecutive,
    group_located,
    group_rows,
    jagged_values,
    whole_rows,
)
from shardrec.dataloader.multihot.multihot_tables import IndexTables

PAD_LABEL = -1.0
"""Label of padding rows (tail="pad"): the trainer masks label < 0 out of loss and metrics."""


class BatchGatherer:
    """Reads rows of a split (a list of memory-mapped parts) into torchrec Batches."""

    def __init__(
        self,
        parts: Sequence[Part],
        feature_names: list[str],
        multi_hot: set[str],
        modulo: dict[str, int] | None = None,
        compiled: bool | None = None,
        index_tables: IndexTables | None = None,
    ) -> None:
        """`compiled`: use the numba kernels (default: when numba imports); False: numpy only.
        `index_tables`: multi-hot index tables that turn every one-hot id into its multi-hot ids at
            batch time.
        `parts`: a PartSet (maps parts as they are used, a bounded number at a time) or a list."""
        if not len(parts):
            raise ValueError("a split needs at least one part")
        # Plain ndarray views of the maps (a PartSet's are already).
        self.parts = parts if isinstance(parts, PartSet) else [p.plain() for p in parts]
        self.feature_names = list(feature_names)
        self.multi_hot = set(multi_hot)
        self.modulo = dict(modulo or {})
        self.index_tables = index_tables
        # Table rows per feature: ids at or beyond them are refused, not looked up (fbgemm's CPU
        # kernel would train row 0 instead; on CUDA nothing may catch them). Folded features
        # (modulo) cannot leave their table.
        self.limits = {k: v for k, v in parts[0].limits.items() if k not in self.modulo}
        assert index_tables is None or not self.multi_hot, (
            "multi-hot ids are made from one-hot features only"
        )
        self.num_dense = int(parts[0].dense.shape[1])
        rows = part_rows(parts)
        self._part_starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        self._locator = PartLocator(self._part_starts, rows)
        self.memory = BatchMemory(self.num_dense, len(self.feature_names))
        self.compiled = kernels.AVAILABLE if compiled is None else compiled
        if self.compiled and not kernels.AVAILABLE:
            raise ValueError("compiled gathers need numba, which does not import here")
        self.kjts = KjtMaker(self.feature_names, index_tables, self.compiled)
        # Per gathering thread (prefetch workers gather at once), the parts its gathers hold and
        # their columns' data addresses, for the kernels that read rows of several parts.
        self._held = threading.local()
        # The kernels' layout, read from part 0 now: mapping it again for a thread's first gather
        # would put it back among the parts a stream keeps mapped.
        self._layout = ColumnLayout(self.feature_names, self.parts[0], max(rows))

    def _held_parts(self) -> HeldParts:
        """This thread's held parts, started again if the PartSet unmapped any part since."""
        held = getattr(self._held, "parts", None)
        if held is None:
            held = self._held.parts = HeldParts(self._layout, len(self.parts))
        generation = self.parts.generation if isinstance(self.parts, PartSet) else 0
        if held.generation != generation:
            held.start_again(generation)
        return held

    def _part_range(self, rows: np.ndarray) -> tuple[int, int]:
        """First and last part holding any of the rows (parts are consecutive row ranges)."""
        if len(self.parts) == 1:
            return 0, 0
        ends = np.searchsorted(self._part_starts, [rows.min(), rows.max()], side="right") - 1
        return int(ends[0]), int(ends[1])

    def _pick(self, column: np.ndarray, groups: Groups, i: int) -> np.ndarray:
        """Group i's rows of one column: a view for a contiguous span, else a gather."""
        span = groups.spans[i]
        return (
            column[span[0] : span[1]]
            if span is not None
            else np.take(column, groups.local[i], axis=0)
        )

    def _column(self, groups: Groups, n: int, get, out: np.ndarray) -> np.ndarray:
        """Gather one column from every part into `out` (cast to out's dtype on assignment)."""
        if self.compiled and self._column_compiled(groups, get, out):
            return out
        if len(groups.parts) == 1:
            col = get(self.parts[groups.parts[0]])
            if groups.spans[0] is None and col.dtype == out.dtype and out.flags.c_contiguous:
                # mode="clip" lets take write straight into `out` (indices are known valid).
                return np.take(col, groups.local[0], axis=0, out=out, mode="clip")
            out[...] = self._pick(col, groups, 0)
            return out
        for i, (p, where) in enumerate(zip(groups.parts, groups.where)):
            taken = self._pick(get(self.parts[p]), groups, i)
            if where is None:
                out[...] = taken
            else:
                out[where] = taken
        return out

    def _column_compiled(self, groups: Groups, get, out: np.ndarray) -> bool:
        """`_column` by the kernels; False where numpy does better (or numba cannot: float16).

        numpy keeps consecutive rows (a slice copy) and dense rows of a single part that are not
        whole rows of `out`'s dtype; the kernels take the 1-d columns, copy whole dense rows
        and, across parts, write rows straight to their positions.
        """
        if len(groups.parts) == 1:
            if groups.spans[0] is not None:
                return False
            column = get(self.parts[groups.parts[0]])
            if out.ndim == 1:
                kernels.take_values(column, groups.local[0], None, out)
                return True
            if whole_rows(column, out):
                kernels.copy_rows(column, groups.local[0], out)
                return True
            return False
        if get(self.parts[groups.parts[0]]).dtype == np.float16:
            return False
        take = kernels.take_values if out.ndim == 1 else kernels.take_rows
        for p, local, where in zip(groups.parts, groups.local, groups.where):
            take(get(self.parts[p]), local, where, out)
        return True

    def _check_ids(
        self,
        name: str,
        values: np.ndarray,
        rows: np.ndarray,
        hi: int | None = None,
        source: np.ndarray | None = None,
    ) -> None:
        """Refuse ids of `name` at or beyond its table's rows. values[k] came from global row
        rows[k]; `hi`: their largest as a kernel found it; else the max of `source`, the same
        ids in their own (unsigned) dtype, a quarter of the int64 bytes for uint16 ids and, for
        consecutive rows, a view of the map; else one max over `values`."""
        limit = self.limits.get(name)
        if not limit:
            return
        if hi is None:
            hi = (source if source is not None else values.view(np.uint64)).max(initial=0)
        if int(hi) >= limit:
            raise bad_id_error(self.parts, self._part_starts, name, values, rows)

    def _take(self, groups: Groups, n: int, get) -> np.ndarray:
        """One column of the rows, in the column's own dtype."""
        if len(groups.parts) == 1:
            return self._pick(get(self.parts[groups.parts[0]]), groups, 0)
        first = get(self.parts[groups.parts[0]])
        out = np.empty((n, *first.shape[1:]), first.dtype)
        for i, (p, where) in enumerate(zip(groups.parts, groups.where)):
            out[where] = self._pick(get(self.parts[p]), groups, i)
        return out

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
        if self.compiled and not self.multi_hot and first_last[0] != first_last[1]:
            if consecutive(rows):
                return self._batches(slices, *self._gather_consecutive(rows, first_last, count, b))
            return self._batches(
                slices, *self._gather_located(self._locator.locate(rows), count, b, rows)
            )
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
            values = self.memory.ids(count, b)
            # Rows of one part: the kernels, a gather in shuffled order, a cast copy of consecutive
            # rows (several parts went to _gather_located).
            compiled = self.compiled and len(groups.parts) == 1
            span = groups.spans[0] if compiled else None
            for f, name in enumerate(self.feature_names):
                if compiled and (span is None or name not in self.modulo):
                    column = self.parts[groups.parts[0]].sparse[name]
                    if span is None:
                        hi = kernels.take_ids(
                            column, groups.local[0], values, f, self.modulo.get(name, 0)
                        )
                    else:
                        hi = kernels.copy_ids(column, span[0], values, f, 0, n)
                    self._check_ids(name, values[:, f, :], rows, hi)
                    continue
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
        b = len(slices[0][0])
        if len(labels) and (labels.max() > 1 or labels.min() < 0):
            rows = np.concatenate([r for r, _ in slices])
            raise bad_label_error(self.parts, self._part_starts, rows)
        for i, (_, real) in enumerate(slices):
            if real < b:
                labels[i * b + real : (i + 1) * b] = PAD_LABEL
        return [
            Batch(
                dense_features=torch.from_numpy(dense[i * b : (i + 1) * b]),
                sparse_features=kjts[i],
                labels=torch.from_numpy(labels[i * b : (i + 1) * b]),
            )
            for i in range(len(slices))
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

    def _gather_located(
        self, located: tuple[np.ndarray, np.ndarray], count: int, b: int, rows: np.ndarray
    ):
        """Labels, dense and one-hot ids of rows spread over several parts, each written once,
        in order (no grouping by part, no scattered writes). located: (part_of, local)."""
        n = count * b
        part_of, local = located
        # The parts used, held (mapped) by this thread while the kernels read their raw
        # addresses; a shuffle group's windows use the same parts, held once.
        held = self._held_parts()
        keys = held.keys(part_of, local, self._hold)
        layout, addresses, same = held.layout, held.addresses, held.same

        def fallback() -> Groups:  # numpy, part by part (layouts differ, or float16)
            return group_located(part_of, local)

        labels, dense = self.memory.labels_dense(n)
        if same[0]:
            kernels.take_values_parts(
                layout.like[0], addresses[0], int(layout.strides[0]), *keys, labels
            )
        else:
            self._column(fallback(), n, lambda p: p.labels, labels)
        if same[1]:
            reference = held.held[0].dense  # the layout every usable part has
            if whole_rows(reference, dense):
                kernels.copy_rows_parts(addresses[1], int(layout.strides[1]), *keys, dense)
            else:
                kernels.take_rows_parts(
                    layout.like[1],
                    addresses[1],
                    int(layout.strides[1]),
                    reference.strides[1],
                    *keys,
                    dense,
                )
        else:
            self._column(fallback(), n, lambda p: p.dense, dense)
        values = self.memory.ids(count, b)
        names = self.feature_names
        compiled = [f for f in range(len(names)) if same[f + 2]]
        if compiled:
            highest = take_ids_of_parts(
                held, compiled, [self.modulo.get(names[f], 0) for f in compiled], keys, values
            )
            for f, hi in zip(compiled, highest.tolist()):
                self._check_ids(names[f], values[:, f, :], rows, hi)
        for f in [f for f in range(len(names)) if not same[f + 2]]:
            name = names[f]
            taken = self._take(fallback(), n, lambda p, name=name: p.sparse[name])
            values[:, f, :] = taken.reshape(count, b)
            self._check_ids(name, values[:, f, :], rows, source=taken)
            if name in self.modulo:
                np.remainder(values[:, f, :], self.modulo[name], out=values[:, f, :])
        self._held_parts()  # parts unmapped meanwhile (a bound, the stream left a group): let go
        return labels, dense, self.kjts.one_hot(values, b)

    def _hold(self, numbers: list[int]) -> list[Part]:
        """Parts `numbers`, mapped (a PartSet's under one lock)."""
        if isinstance(self.parts, PartSet):
            return self.parts.hold(numbers)
        return [self.parts[p] for p in numbers]

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
