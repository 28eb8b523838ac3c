"""The one-hot ids of a Parquet row group some of whose categoricals were read as dictionaries
(parse/parquet_rows.py): each distinct value's id made once, then taken by each row's index. The
ids, the missing values' and the refusal of a reserved raw id are hash_rows_into's on the same
values spread over the rows, so a Parquet file gives the bytes a CSV of its rows gives."""

from __future__ import annotations

import numpy as np

from shardrec.dataloader.format.raw_ids import MISSING_KEY
from shardrec.tools.preprocess.ids.id_maps import hash_ids
from shardrec.tools.preprocess.parse.parquet_kernel import first_entry_row, gather_entry_ids
from shardrec.tools.preprocess.parse.spec_parse import DictionaryValues, SpecChunk
from shardrec.tools.preprocess.parts import column_kernels


def dictionary_ids_into(
    chunk: SpecChunk,
    rows: np.ndarray,
    features: np.ndarray,
    cardinalities: np.ndarray,
    out: np.ndarray,
    offset: int,
) -> int:
    """column_kernels.hash_rows_into for a chunk with dictionaries: out[j, offset + k] = the id of
    rows[k]'s value of one-hot feature features[j]. Returns k * len(features) + j for the first
    k, then j, whose raw id is MISSING_KEY itself (no id may be: format.raw_ids), or -1."""
    rows = rows.astype(np.int64, copy=False)
    first = -1
    for j, slot in enumerate(features.tolist()):
        column = chunk.dictionaries.get(slot)
        if column is None:
            k = column_kernels.hash_rows_into(chunk.sparse, chunk.sparse_missing, rows,
                                            features[j : j + 1], cardinalities, out[j : j + 1],
                                            offset)  # fmt: skip
        else:
            ids, reserved = _held_entry_ids(column, slot, int(cardinalities[slot]), out.dtype)
            gather_entry_ids(ids, column.indices, column.valid, column.at, rows, out, j,
                             offset)  # fmt: skip
            # Which row is the first to hold a reserved raw id is asked only of a dictionary
            # that holds one (the run is refused then), not of every row.
            k = -1
            if reserved.any():
                k = first_entry_row(reserved, column.indices, column.valid, column.at, rows)
        if k >= 0 and (first < 0 or k * len(features) + j < first):
            first = k * len(features) + j
    return first


_MADE: dict[int, tuple] = {}


def _held_entry_ids(
    column: DictionaryValues, slot: int, cardinality: int, dtype
) -> tuple[np.ndarray, np.ndarray]:
    """_entry_ids, a column's last ones given again for the same entries: the parser gives an
    equal dictionary's entries (a row group's after another's, in a file written from
    dictionaries) as the same arrays, which it never writes to again (parquet_rows._entries), so
    `is` is an exact test here; held, they cannot be freed and their identity reused."""
    held = _MADE.get(slot)
    if held is not None and held[0] is column.values and held[1] is column.absent:
        if held[2] == (cardinality, dtype):
            return held[3], held[4]
    ids, reserved = _entry_ids(column, cardinality, dtype)
    _MADE[slot] = (column.values, column.absent, (cardinality, dtype), ids, reserved)
    return ids, reserved


def _entry_ids(column: DictionaryValues, cardinality: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """(id, reserved) of each dictionary entry and of one more, missing: a null row's, made as
    hash_ids makes an empty value's (0, or a raw id's MISSING_KEY). reserved: a raw id that is
    MISSING_KEY itself."""
    values = np.append(column.values, np.uint64(0))  # a plain 0 would make them float64
    absent = np.append(column.absent, True)
    reserved = np.zeros(len(values), bool)
    if cardinality == 0:
        reserved = (values == np.uint64(MISSING_KEY)) & ~absent
    return hash_ids(values, absent, cardinality).astype(dtype), reserved
