"""Vocabulary pass 1: per-feature (value, count) pairs of a task's training rows (vocab.py keeps
them).

numpy's way to count a piece's columns (ids.count_values: the kept rows transposed into
contiguous columns, missing values masked out, a copy cast to 32 bits, sorted, compared with its
neighbours, run lengths taken) made ~8 passes over every value, the sort being the cheapest of
them. Here one compiled pass over the rows, in the order they lie in memory, writes each column's
present values as 32 bits (Criteo's hex values fit); numpy sorts each column in place (its SIMD
sort of 32-bit keys: numba's sorts took several times longer); a compiled pass takes the
runs. A column with a value wider than 32 bits (a string's 64-bit hash, a feature spec's lists)
is counted by ids.count_values. The result is np.unique(values, return_counts=True)'s, as uint64
values and int64 counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from shardrec.dataloader.util.jit import AVAILABLE, njit
from shardrec.dataloader.util.locks import WORK_DIR
from shardrec.tools.preprocess import cpu_stages
from shardrec.tools.preprocess.ids.id_maps import count_values
from shardrec.tools.preprocess.ids.vocab import CountRuns
from shardrec.tools.preprocess.parse.text_parser import Chunk
from shardrec.tools.preprocess.parts import column_kernels
from shardrec.tools.preprocess.tasks.task import Task, TaskOptions, split_rows
from shardrec.tools.preprocess.tasks.task_run import parquet_chunks, process_setup
from shardrec.tools.preprocess.tasks.task_text import read_pieces


@njit(cache=True, nogil=True, boundscheck=False)
def _gather_present(values, missing, rows, columns, present, wide):
    """columns[f, :present[f]] = the low 32 bits of values[rows[k], f] not missing, in row order;
    wide[f]: some value of column f has more than 32 bits (the column must be counted in 64)."""
    for k in range(len(rows)):
        r = rows[k]
        for f in range(values.shape[1]):
            if not missing[r, f]:
                v = values[r, f]
                wide[f] |= (v >> np.uint64(32)) != 0
                columns[f, present[f]] = np.uint32(v & np.uint64(0xFFFFFFFF))
                present[f] += 1


@njit(cache=True, nogil=True, boundscheck=False)
def _runs(ordered):
    """(distinct values, how many times each occurs) of a sorted array."""
    distinct = 0
    for i in range(len(ordered)):
        distinct += i == 0 or ordered[i] != ordered[i - 1]
    values, counts = np.empty(distinct, np.uint64), np.zeros(distinct, np.int64)
    j = -1
    for i in range(len(ordered)):
        if i == 0 or ordered[i] != ordered[i - 1]:
            j += 1
            values[j] = ordered[i]
        counts[j] += 1
    return values, counts


def count_columns(
    values: np.ndarray, missing: np.ndarray, rows: np.ndarray
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(sorted distinct values, counts) of each column of `values` [rows, features] over `rows`
    (row numbers), missing values left out."""
    if not AVAILABLE:
        return [count_values(values[rows, f], missing[rows, f]) for f in range(values.shape[1])]
    features = values.shape[1]
    columns = np.empty((features, len(rows)), np.uint32)
    present, wide = np.zeros(features, np.int64), np.zeros(features, np.bool_)
    _gather_present(values, missing, rows.astype(np.int64, copy=False), columns, present, wide)
    out = []
    for f in range(features):
        if wide[f]:
            out.append(count_values(values[rows, f], missing[rows, f]))
            continue
        column = columns[f, : present[f]]
        column.sort()
        out.append(_runs(column))
    return out


def piece_counts(
    chunk: Chunk, rows: np.ndarray, opts: TaskOptions
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(distinct values, counts) of every sparse feature over the rows where `rows` is True."""
    idx = np.flatnonzero(rows)
    if not opts.parser.program:
        return count_columns(chunk.sparse, chunk.sparse_missing, idx)
    out = []
    for _, is_list, slot in opts.parser.program.features:
        if not is_list:
            out.append(count_values(chunk.sparse[idx, slot], chunk.sparse_missing[idx, slot]))
            continue
        values = np.empty(int(chunk.list_len[idx, slot].sum()), np.uint64)
        column_kernels.gather_lists(
            chunk.list_values, chunk.list_start, chunk.list_len, slot, idx, values
        )
        out.append(count_values(values, np.zeros(len(values), bool)))
    return out


def _chunks(task: Task, opts: TaskOptions) -> Iterator[Chunk]:
    """The task's pieces, parsed (text) or decoded (Parquet row groups)."""
    for chunk, _, _ in parquet_chunks(task, opts):
        yield chunk
    in_quote = False  # as run_task reads its pieces: a quoted line break may cross their ends
    for data in read_pieces(task.text, blank=opts.parser.blank) if not task.parquet else ():
        with cpu_stages.stage(cpu_stages.PARSE):
            chunk = opts.parser.parse(data, in_quote)
        in_quote = chunk.ends_in_quote
        yield chunk


def count_task(task: Task, opts: TaskOptions) -> Path:
    """Per-feature value counts of the task's training rows, as sorted runs on disk (vocab.CountRuns:
    spilled whenever opts.vocab_memory_bytes of pairs are held)."""
    process_setup()
    runs = CountRuns(Path(opts.out) / WORK_DIR, task.index, opts.names, opts.vocab_memory_bytes)
    line0 = 0
    for chunk in _chunks(task, opts):
        with cpu_stages.stage(cpu_stages.COUNT):
            for split, mask in split_rows(task, line0, chunk.rows):
                if split != "train":
                    continue
                for f, counted in enumerate(piece_counts(chunk, mask & chunk.ok, opts)):
                    runs.add(f, *counted)
            runs.maybe_spill()
        line0 += chunk.rows
    with cpu_stages.stage(cpu_stages.COUNT):
        return runs.finish()
