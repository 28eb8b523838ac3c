"""A slice's rows grouped by the part that holds them: what the numpy gathers (and the
multi-hot ones) go through, part by part, where the many-parts kernels (many_parts.py) do not.

Consecutive rows of a part (no shuffle) are noted as a span, so they are read as a slice (a
memcpy), not gathered. Also the tests the gatherer picks its path by (`consecutive`, `whole_rows`)
and the multi-hot values of a slice (`jagged_values`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from shardrec.dataloader.gather import gather_kernels as kernels


@dataclass
class Groups:
    """The rows of one slice grouped by the part that holds them."""

    parts: list[int]
    local: list[np.ndarray]  # row index inside the part
    where: list[np.ndarray | None]  # positions in the slice (None: the whole slice, in order)
    spans: list[tuple[int, int] | None] = field(
        default_factory=list
    )  # local rows a:b when contiguous

    def __post_init__(self) -> None:
        self.spans = [span(local) for local in self.local]


def span(local: np.ndarray) -> tuple[int, int] | None:
    """(a, b) if `local` is exactly a, a+1, ..., b-1."""
    n = len(local)
    if n == 0 or int(local[-1]) - int(local[0]) != n - 1:
        return None
    return (
        (int(local[0]), int(local[-1]) + 1) if n == 1 or bool(np.all(np.diff(local) == 1)) else None
    )


def group_rows(
    rows: np.ndarray, part_starts: np.ndarray, first_last: tuple[int, int], compiled: bool
) -> Groups:
    """Global rows grouped by part; `first_last`: the first and last part holding any of them,
    part_starts: [parts + 1] first global row of each part, then the total."""
    first, last = first_last
    if first == last:
        return Groups([first], [rows - part_starts[first] if first else rows], [None])
    if compiled:
        counts, where, local = kernels.group_by_part(rows, part_starts)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        used = [p for p in range(len(counts)) if counts[p]]
        return Groups(
            used,
            [local[bounds[p] : bounds[p + 1]] for p in used],
            [where[bounds[p] : bounds[p + 1]] for p in used],
        )
    part_of = np.searchsorted(part_starts, rows, side="right") - 1
    order = np.argsort(part_of, kind="stable")
    bounds = np.searchsorted(part_of[order], np.arange(first, last + 2))
    parts, local, wheres = [], [], []
    for p, a, b in zip(range(first, last + 1), bounds[:-1], bounds[1:]):
        if a < b:
            where = order[a:b]
            parts.append(p)
            local.append(rows[where] - part_starts[p])
            wheres.append(where)
    return Groups(parts, local, wheres)


def group_located(part_of: np.ndarray, local: np.ndarray) -> Groups:
    """Located rows (part_of[k]: row k's part, local[k]: its row there) grouped by part."""
    order = np.argsort(part_of, kind="stable")
    # Each part's rows are a run of `order`; counted, not searched for up to the next index, which
    # wraps past the dtype's largest part (255 in uint8) and lost that part's rows.
    used, counts = np.unique(part_of, return_counts=True)
    bounds = np.concatenate([[0], np.cumsum(counts)])
    wheres = [order[a:z] for a, z in zip(bounds[:-1], bounds[1:])]
    return Groups(used.tolist(), [local[w] for w in wheres], wheres)


def consecutive(rows: np.ndarray) -> bool:
    """Whether rows are r, r + 1, r + 2, ... (a slice of the stream without shuffle)."""
    n = len(rows)
    return n > 0 and int(rows[-1]) - int(rows[0]) == n - 1 and bool(np.all(np.diff(rows) == 1))


def whole_rows(column: np.ndarray, out: np.ndarray) -> bool:
    """Whether each row of a 2-d `column` is one of `out`'s rows byte for byte (same dtype, each
    row's values contiguous in both), so that rows can be copied whole."""
    return (
        column.dtype == out.dtype
        and column.strides[1] == column.itemsize
        and out.flags.c_contiguous
        and column.shape[1:] == out.shape[1:]
    )


def jagged_values(groups: Groups, chunks: list, lens: np.ndarray) -> np.ndarray:
    """The ids of a multi-hot feature for the slice, row by row in slice order, as int64."""
    # Position of each slice row's first id in the output.
    out_starts = np.concatenate([[0], np.cumsum(lens, dtype=np.int64)[:-1]])
    out = np.empty(int(lens.sum()), np.int64)
    for (ids, starts, count), where in zip(chunks, groups.where):
        dst = out_starts if where is None else out_starts[where]
        total = int(count.sum())
        if total == 0:
            continue
        # Source and destination index of every id, without a loop over rows.
        shift = np.repeat(np.cumsum(count) - count, count)
        k = np.arange(total, dtype=np.int64) - shift
        out[np.repeat(dst, count) + k] = np.take(ids, np.repeat(starts, count) + k)
    return out
