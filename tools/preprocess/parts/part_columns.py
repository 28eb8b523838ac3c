"""A part under construction: its columns, filled in place from parsed pieces of text.

Rows are appended into the very arrays that are written (labels, dense values, one id column
per feature in its final dtype), so a part is never concatenated from per-piece arrays or cast
column by column. In hashing mode with numba, ids are hashed straight into those columns and the
dense log1p input is gathered in one compiled pass; otherwise the generic functions are used,
with the same bytes as the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from shardrec.dataloader.format.arrow_ipc import FileLayout
from shardrec.dataloader.format.manifest import PartInfo, smallest_uint
from shardrec.dataloader.format.part_file import write_part
from shardrec.dataloader.format.raw_ids import MISSING_KEY
from shardrec.tools.preprocess import cpu_stages
from shardrec.tools.preprocess.ids.id_maps import Vocabulary, hash_ids
from shardrec.tools.preprocess.ids.vocab_kernel import lookup_features_into
from shardrec.tools.preprocess.parse import parse_kernel
from shardrec.tools.preprocess.parse.criteo_text import ParsedChunk, transform_dense
from shardrec.tools.preprocess.parse.spec_parse import SpecChunk
from shardrec.tools.preprocess.parse.spec_program import Program
from shardrec.tools.preprocess.parts import column_kernels
from shardrec.tools.preprocess.parts.dense_table import append_dense, log1p_table
from shardrec.tools.preprocess.parts.dictionary_ids import dictionary_ids_into


class NonFiniteDense(ValueError):
    """A dense value that its part's dtype cannot hold: a `none` transform's value past the range
    of float16 (65,504) or float32; the model would train on infinity."""

    def __init__(self, row: int, column: int, value: float) -> None:
        super().__init__(f"row {row}: dense column {column}: {value!r} is not finite when stored")
        self.row, self.column, self.value = row, column, value


def check_finite(block: np.ndarray, values: np.ndarray, rows: np.ndarray, transforms: list[str]):
    """NonFiniteDense for the first row of `block` (the dense values of `rows`, transformed) that
    holds a non-finite value. Only `none` columns are looked at: a log transform's largest value
    (log1p of float64's largest, ~710) fits every dtype."""
    first = None
    for d, how in enumerate(transforms):
        if how != "none":
            continue
        bad = np.flatnonzero(~np.isfinite(block[:, d]))
        if len(bad) and (first is None or bad[0] < first[0]):
            first = (int(bad[0]), d)
    if first is not None:
        k, d = first
        raise NonFiniteDense(int(rows[k]), d, float(values[rows[k], d]))


def map_ids(
    chunk: ParsedChunk,
    names: list[str],
    cardinalities: tuple[int, ...],
    vocabs: list[Vocabulary] | None,
) -> dict[str, np.ndarray]:
    """Every row's ids per feature, in its column's dtype: hashed, or looked up in vocabularies."""
    if vocabs is None and parse_kernel.AVAILABLE:
        ids = column_kernels.hash_matrix(
            chunk.sparse, chunk.sparse_missing, np.asarray(cardinalities, dtype=np.int64)
        )
        return {n: ids[:, f].astype(id_dtype(cardinalities[f])) for f, n in enumerate(names)}
    out = {}
    for f, name in enumerate(names):
        values, missing = chunk.sparse[:, f], chunk.sparse_missing[:, f]
        ids = (
            vocabs[f].lookup(values, missing)
            if vocabs
            else hash_ids(values, missing, cardinalities[f])
        )
        out[name] = ids.astype(id_dtype(cardinalities[f]))
    return out


def id_dtype(cardinality: int) -> np.dtype:
    """A feature's id column dtype: the smallest that holds its table's rows; uint64 for raw ids
    (cardinality 0)."""
    return np.dtype(np.uint64) if cardinality == 0 else smallest_uint(cardinality - 1)


class ReservedRawIdError(ValueError):
    """A raw id that is the empty field's own value (format.raw_ids), at appended row `k`."""

    def __init__(self, k: int, features: str) -> None:
        self.k, self.features = k, features
        super().__init__(
            f"{features}: {MISSING_KEY:016x} (this raw id marks an empty field in a dataset of raw "
            "ids; no id may be it: rewrite it in the input)"
        )


def check_raw_ids(bad: int, chunk_names: list[str], features: np.ndarray) -> None:
    """Refuse a raw id that is the empty field's own value (hash_rows_into found one: `bad`)."""
    if bad >= 0:
        k, j = divmod(bad, len(features))
        raise ReservedRawIdError(k, chunk_names[int(features[j])])


def id_groups(cardinalities: tuple[int, ...]) -> list[tuple[np.dtype, np.ndarray]]:
    """Features grouped by the dtype of their id column (one group when all share --max-ids)."""
    groups: dict[np.dtype, list[int]] = {}
    for f, c in enumerate(cardinalities):
        groups.setdefault(id_dtype(c), []).append(f)
    return [(dtype, np.asarray(feats, dtype=np.int64)) for dtype, feats in groups.items()]


_SPARE: list[np.ndarray] = []
"""The memory of parts already written (flat uint8 buffers), for the next parts' columns: fresh
pages are zeroed by the kernel as they are first written (numpy asks for huge pages past 4 MB),
which was ~13% of a Parquet run's CPU (perf, 4 M Criteo-shaped rows), all of it again per part."""


def _array(shape: tuple[int, ...] | list[int], dtype) -> np.ndarray:
    """An uninitialised C-order array, in a spare buffer that is large enough where there is one."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    fits = [i for i, b in enumerate(_SPARE) if b.nbytes >= size]
    if not fits:
        return np.empty(shape, dtype)
    buffer = _SPARE.pop(min(fits, key=lambda i: _SPARE[i].nbytes))  # the smallest that fits
    return buffer[:size].view(dtype).reshape(shape)


def _spare(*arrays: np.ndarray) -> None:
    """Keep the memory of arrays no longer used (a written part's) for later ones."""
    for a in arrays:
        while isinstance(a.base, np.ndarray):
            a = a.base
        if a.flags.c_contiguous and len(_SPARE) < 64:
            _SPARE.append(a.reshape(-1).view(np.uint8))


def _grown(a: np.ndarray, capacity: int, rows: int, axis: int) -> np.ndarray:
    shape = list(a.shape)
    shape[axis] = capacity
    b = _array(shape, a.dtype)
    index = (slice(None),) * axis + (slice(0, rows),)
    b[index] = a[index]
    _spare(a)
    return b


class PartColumns:
    """One split's rows of the part being built, held in the arrays that are written as they are.

    Pieces append their kept rows in place, so a part is never gathered from per-piece arrays
    (no concatenation, half the peak memory). Ids are stored one row per feature, grouped by
    dtype, so each feature's column is a contiguous slice.
    """

    def __init__(
        self,
        capacity: int,
        num_dense: int,
        dense_dtype: str,
        groups: list[tuple[np.dtype, np.ndarray]],
        lists: Sequence[np.dtype] = (),
    ) -> None:
        """lists: the id dtype of each list feature (a spec's list columns), stored jagged: its ids
        back to back, grown as rows arrive, and rows + 1 offsets."""
        self.rows, self.capacity, self.groups = 0, max(capacity, 1), groups
        self.labels = _array((self.capacity,), np.uint8)
        self.dense = _array((self.capacity, num_dense), dense_dtype)
        self.ids = [_array((len(feats), self.capacity), dtype) for dtype, feats in groups]
        self.list_ids = [_array((self.capacity,), dtype) for dtype in lists]
        self.list_offsets = [_array((self.capacity + 1,), np.int64) for _ in lists]
        for offsets in self.list_offsets:
            offsets[0] = 0

    @property
    def nbytes(self) -> int:
        """About the bytes its files take: its rows of every column (headers aside)."""
        n = self.rows
        per_row = self.labels.itemsize + self.dense.itemsize * self.dense.shape[1]
        per_row += sum(a.itemsize * a.shape[0] for a in self.ids)
        lists = sum(
            int(o[n]) * a.itemsize + 8 * (n + 1) for a, o in zip(self.list_ids, self.list_offsets)
        )
        return n * per_row + lists

    def reserve(self, n: int) -> None:
        if self.rows + n <= self.capacity:
            return
        # Only when the row estimate fell short (a gzip task, unusually short rows).
        self.capacity = max(self.rows + n, self.capacity * 3 // 2)
        self.labels = _grown(self.labels, self.capacity, self.rows, 0)
        self.dense = _grown(self.dense, self.capacity, self.rows, 0)
        self.ids = [_grown(a, self.capacity, self.rows, 1) for a in self.ids]
        self.list_offsets = [
            _grown(a, self.capacity + 1, self.rows + 1, 0) for a in self.list_offsets
        ]

    def reserve_list(self, c: int, n: int) -> None:
        """Room for n more ids of list feature c."""
        used = int(self.list_offsets[c][self.rows])
        if used + n > len(self.list_ids[c]):
            self.list_ids[c] = _grown(
                self.list_ids[c], max(used + n, len(self.list_ids[c]) * 3 // 2), used, 0
            )

    def columns(self, names: list[str]) -> dict[str, np.ndarray]:
        by_feature = {}
        for (_, feats), ids in zip(self.groups, self.ids):
            for j, f in enumerate(feats):
                by_feature[int(f)] = ids[j, : self.rows]
        return {names[f]: by_feature[f] for f in range(len(names))}

    def write(
        self,
        path: Path,
        layout: FileLayout,
        names: list[str],
        fsync: bool,
        list_names: Sequence[str] = (),
    ) -> PartInfo:
        """Write the part file at `path` (its columns in the layout's order). names: the one-hot
        features in id-column order; list_names: the list features."""
        sparse = self.columns(names)
        offsets = {}
        for name, ids, off in zip(list_names, self.list_ids, self.list_offsets):
            offsets[name] = off[: self.rows + 1]
            sparse[name] = ids[: int(off[self.rows])]
        info = write_part(
            path,
            layout,
            self.labels[: self.rows],
            self.dense[: self.rows],
            sparse,
            offsets,
            fsync=fsync,
        )
        # written (copied to the file): the columns' memory serves the next parts
        _spare(self.labels, self.dense, *self.ids, *self.list_ids, *self.list_offsets)
        return info


_PAST: list[np.ndarray] = []


def _log1p_into(out: np.ndarray, chunk: ParsedChunk, rows: np.ndarray) -> None:
    """out[k] = log1p(max(dense[rows[k]], 0)) in out's dtype: looked up in dense_table's log1p_table
    (one pass, ~27 M values per GB of text), computed with np.log1p for the values past it."""
    table, _ = log1p_table(out.dtype.name)  # bits of the dense dtype's values
    if not _PAST or _PAST[0].size < out.size:  # reused across pieces: no fresh pages to fault in
        _PAST[:] = [np.empty(out.size, np.int64)]
    n = column_kernels.gather_from_table(chunk.dense, rows, table, out.view(table.dtype), _PAST[0])
    if n:
        at = _PAST[0][:n]
        values = chunk.dense[rows[at // out.shape[1]], at % out.shape[1]]
        out.reshape(-1)[at] = np.log1p(values.astype(np.float64))  # positive: no clamp needed


def append_rows(
    cols: PartColumns,
    chunk: ParsedChunk,
    rows: np.ndarray,
    dense_transform: str,
    dense_dtype: str,
    names: list[str],
    cardinalities: tuple[int, ...],
    vocabs: list[Vocabulary] | None,
) -> None:
    """Transform and map the given rows of a parsed piece onto the end of a part's columns.

    The compiled path (hashing mode, default transform) gives the same bytes as the generic one.
    """
    n, k = cols.rows, len(rows)
    cols.reserve(k)
    cols.labels[n : n + k] = chunk.labels[rows]
    with cpu_stages.stage(cpu_stages.DENSE):
        if parse_kernel.AVAILABLE and dense_transform == "log1p":
            _log1p_into(cols.dense[n : n + k], chunk, rows)
        else:
            cols.dense[n : n + k] = transform_dense(
                chunk.dense[rows], chunk.dense_missing[rows], dense_transform, dense_dtype
            )
            if dense_transform == "none":
                check_finite(
                    cols.dense[n : n + k],
                    chunk.dense,
                    rows,
                    [dense_transform] * chunk.dense.shape[1],
                )
    with cpu_stages.stage(cpu_stages.IDS):
        if vocabs is None and parse_kernel.AVAILABLE:
            cards = np.asarray(cardinalities, dtype=np.int64)
            for (_, feats), ids in zip(cols.groups, cols.ids):
                bad = column_kernels.hash_rows_into(
                    chunk.sparse, chunk.sparse_missing, rows, feats, cards, ids, n
                )
                check_raw_ids(bad, names, feats)
        elif parse_kernel.AVAILABLE:
            for (_, feats), ids in zip(cols.groups, cols.ids):
                lookup_features_into(
                    vocabs, chunk.sparse, chunk.sparse_missing, rows, feats, ids, n
                )
        else:
            mapped = map_ids(chunk, names, cardinalities, vocabs)
            for (_, feats), ids in zip(cols.groups, cols.ids):
                for j, f in enumerate(feats):
                    ids[j, n : n + k] = mapped[names[f]][rows]
    cols.rows += k


def append_spec_rows(
    cols: PartColumns,
    chunk: SpecChunk,
    rows: np.ndarray,
    program: Program,
    dense_dtype: str,
    cardinalities: tuple[int, ...],
    vocabs: list[Vocabulary] | None,
) -> None:
    """append_rows for text parsed by a feature spec: each dense column with its own transform,
    one-hot ids hashed (or looked up) into their columns, list ids appended with their offsets.

    cardinalities and vocabs: one per sparse feature, in spec order (program.features).
    """
    n, k = cols.rows, len(rows)
    cols.reserve(k)
    cols.labels[n : n + k] = chunk.labels[rows]
    transforms = [c.transform for c in program.spec.dense]
    append_dense(
        cols.dense[n : n + k], chunk.dense, chunk.dense_missing, rows, transforms, dense_dtype
    )
    features = program.features
    one_hot = [f for f, (_, is_list, _) in enumerate(features) if not is_list]
    if vocabs is None:
        cards = np.asarray([cardinalities[f] for f in one_hot], dtype=np.int64)
        for (_, feats), ids in zip(cols.groups, cols.ids):
            if chunk.dictionaries:  # a Parquet row group's: each distinct value hashed once
                bad = dictionary_ids_into(chunk, rows, feats, cards, ids, n)
            else:
                bad = column_kernels.hash_rows_into(
                    chunk.sparse, chunk.sparse_missing, rows, feats, cards, ids, n
                )
            check_raw_ids(bad, [features[f][0] for f in one_hot], feats)
    else:
        for (_, feats), ids in zip(cols.groups, cols.ids):
            for j, slot in enumerate(feats):
                values, missing = chunk.sparse[rows, slot], chunk.sparse_missing[rows, slot]
                ids[j, n : n + k] = vocabs[one_hot[slot]].lookup(values, missing)
    for f, (_, is_list, c) in enumerate(features):
        if not is_list:
            continue
        count = int(chunk.list_len[rows, c].sum())
        cols.reserve_list(c, count)
        out, offsets = cols.list_ids[c], cols.list_offsets[c]
        at = int(offsets[n])
        if getattr(program.spec.sparse[f], "raw", False):  # a sequence of integers: as written
            column_kernels.gather_lists(
                chunk.list_values, chunk.list_start, chunk.list_len, c, rows, out[at : at + count]
            )
            offsets[n + 1 : n + k + 1] = at + np.cumsum(chunk.list_len[rows, c])
        elif vocabs is None:
            column_kernels.hash_lists_into(
                chunk.list_values,
                chunk.list_start,
                chunk.list_len,
                c,
                rows,
                cardinalities[f],
                out,
                offsets,
                n,
                at,
            )
        else:
            values = np.empty(count, np.uint64)
            column_kernels.gather_lists(
                chunk.list_values, chunk.list_start, chunk.list_len, c, rows, values
            )
            out[at : at + count] = vocabs[f].lookup(values, np.zeros(count, bool))
            offsets[n + 1 : n + k + 1] = at + np.cumsum(chunk.list_len[rows, c])
    cols.rows += k


def list_groups(program: Program, cardinalities: tuple[int, ...]) -> tuple[list, list[np.dtype]]:
    """(id groups of the one-hot features, id dtype of each list feature) of a spec's features."""
    features = program.features
    one_hot = tuple(cardinalities[f] for f, (_, is_list, _) in enumerate(features) if not is_list)
    lists = [id_dtype(cardinalities[f]) for f, (_, is_list, _) in enumerate(features) if is_list]
    return id_groups(one_hot), lists
