"""Reading columns of a split's rows (memory-mapped parts) into a gather's arrays: the parts,
their layouts and held addresses, the compiled and numpy column gathers, and the bounds checks
of what they read. batch.py turns what they read into torchrec Batches.

Rows of many parts are located and their ids read by many_parts.py in one in-order pass per
column; the numpy paths go part by part (row_groups.py).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from shardrec.dataloader.format.integrity import bad_id_error
from shardrec.dataloader.format.part_cache import PartSet, part_rows
from shardrec.dataloader.format.part_file import Part
from shardrec.dataloader.gather import gather_kernels as kernels
from shardrec.dataloader.gather.addresses import ColumnLayout, HeldParts
from shardrec.dataloader.gather.batch_memory import BatchMemory
from shardrec.dataloader.gather.kjts import KjtMaker
from shardrec.dataloader.gather.many_parts import PartLocator, take_ids_of_parts
from shardrec.dataloader.gather.row_groups import Groups, group_located, whole_rows
from shardrec.dataloader.multihot.multihot_tables import IndexTables


class ColumnReader:
    """Reads columns of rows of a split (a list of memory-mapped parts) into a gather's arrays."""

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
            held = self._held.parts = HeldParts(
                self._layout, self._part_starts, self._locator.buckets.parts
            )
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

    def _hold(self, numbers: list[int]) -> list[Part]:
        """Parts `numbers`, mapped (a PartSet's under one lock)."""
        if isinstance(self.parts, PartSet):
            return self.parts.hold(numbers)
        return [self.parts[p] for p in numbers]

    def _gather_located(self, rows: np.ndarray, count: int, b: int, start: int = 0):
        """Labels, dense and one-hot ids of `count` batches of b rows whose gather positions start
        .. start + len(rows) - 1 hold `rows`, spread over several parts, each written once, in
        order (no grouping by part, no scattered writes)."""
        n = len(rows)
        # The parts used, held (mapped) by this thread while the kernels read their raw
        # addresses; a shuffle group's windows use the same parts, held once.
        held = self._held_parts()
        keys = self._locator.keys(rows, held, self._hold)
        layout, addresses, same = held.layout, held.addresses, held.same

        def fallback() -> Groups:  # numpy, part by part (layouts differ, or float16)
            return group_located(*self._locator.locate(rows))

        labels, dense = self.memory.labels_dense(count * b)
        labels_in, dense_in = labels[start : start + n], dense[start : start + n]
        if same[0]:
            kernels.take_values_parts(
                layout.like[0], addresses[0], int(layout.strides[0]), *keys, labels_in
            )
        else:
            self._column(fallback(), n, lambda p: p.labels, labels_in)
        if same[1]:
            reference = held.held[0].dense  # the layout every usable part has
            if whole_rows(reference, dense_in):
                kernels.copy_rows_parts(addresses[1], int(layout.strides[1]), *keys, dense_in)
            else:
                kernels.take_rows_parts(
                    layout.like[1],
                    addresses[1],
                    int(layout.strides[1]),
                    reference.strides[1],
                    *keys,
                    dense_in,
                )
        else:
            self._column(fallback(), n, lambda p: p.dense, dense_in)
        values = self.memory.ids(count, b)
        names = self.feature_names
        compiled = [f for f in range(len(names)) if same[f + 2]]
        if compiled:
            highest = take_ids_of_parts(
                held,
                compiled,
                [self.modulo.get(names[f], 0) for f in compiled],
                keys,
                values,
                start,
            )
            for f, hi in zip(compiled, highest.tolist()):
                self._check_read_ids(names[f], values, f, start, rows, hi)
        for f in [f for f in range(len(names)) if not same[f + 2]]:
            taken = self._take(fallback(), n, lambda p, name=names[f]: p.sparse[name])
            self._put_ids(values, f, start, rows, taken)
        self._held_parts()  # parts unmapped meanwhile (a bound, the stream left a group): let go
        return labels, dense, values

    def _check_read_ids(
        self, name: str, values: np.ndarray, f: int, start: int, rows: np.ndarray, hi: int
    ) -> None:
        """`_check_ids` of ids a kernel wrote to gather positions start .. of values[:, f, :]."""
        limit = self.limits.get(name)
        if limit and int(hi) >= limit:
            read = np.concatenate(positions(values, f, start, len(rows)))
            raise bad_id_error(self.parts, self._part_starts, name, read, rows)

    def _put_ids(
        self, values: np.ndarray, f: int, start: int, rows: np.ndarray, taken: np.ndarray
    ) -> None:
        """Ids of feature f read by numpy (`taken`, in the column's dtype) to gather positions
        start .. of values[:, f, :]: checked, then folded."""
        name, done = self.feature_names[f], 0
        for view in positions(values, f, start, len(taken)):
            view[...] = taken[done : done + len(view)]
            done += len(view)
        self._check_read_ids(name, values, f, start, rows, taken.max(initial=0))
        if name in self.modulo:
            for view in positions(values, f, start, len(taken)):
                np.remainder(view, self.modulo[name], out=view)


def positions(values: np.ndarray, f: int, start: int, n: int) -> list[np.ndarray]:
    """Views of feature f's ids [count, features, b] at gather positions start .. start + n - 1
    (position p: row p % b of batch p // b), batch by batch."""
    b, views, done = values.shape[2], [], 0
    while done < n:
        i, j = divmod(start + done, b)
        m = min(b - j, n - done)
        views.append(values[i, f, j : j + m])
        done += m
    return views
