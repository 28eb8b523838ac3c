"""A shuffled stream read in spans of whole shuffle windows (order.py), for the compiled one-hot
gathers.

The loader gathers several batches at once, so that each column's slice of a shuffle window is
read while it is in the CPU cache. Windows hold `window_blocks` blocks, and a part's last block
is short wherever its rows are no multiple of `block_rows` (every real dataset's parts), so
windows do not start at batch boundaries: a gather of whole batches then read the tail of one
window and the head of the next. A window's rows are permuted over all its blocks, so such a
gather read a sparse subset of twice a window's cache lines, and the next gather the rest of
the same lines again, after the other columns had evicted them. Measured (thread CPU, 120 batches
of 8,192 Criteo-shaped rows): 120 parts of 16,667 rows 0.72x one part's rate, 120 parts of 16,640
(no short block) 0.88x; one window's column read 2,776-4,003 cache lines where one part's aligned
windows read ~2,300.

Here a span is whole windows (at least half of `gather_rows`, or up to the epoch's end): the rows
of this rank's batch slices that lie in them are gathered into their batches' positions, and a
batch that a span ends inside is completed by the next span, from the rows this one left it. The
batches are identical to the fixed runs' (`StreamLoader.batch` reads those): only which gather
reads a row changes.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from shardrec.dataloader.order import EpochOrder


def window_spans(
    order: EpochOrder, rank: int, b: int, start: int, end: int, rows: int
) -> Iterator[tuple[int, int]]:
    """Spans [q0, q1) of rank `rank`'s positions (position k * b + j: row j of its slice of global
    batch k) from `start` to `end`, each ending where a shuffle window does (or at `end`) and
    holding at least half of `rows` where the stream has them."""
    g, n = order.spec.global_batch_size, order.spec.num_samples
    q = start
    while q < end:
        k, j = divmod(q, b)
        pos, stop = k * g + rank * b + j, q
        while stop < end and (stop - q) * 2 < rows:
            if pos >= n:  # padding rows (tail="pad") past the last window
                stop = end
                break
            pos = order.window_end(pos)
            k, x = divmod(pos, g)
            stop = min(k * b + min(max(x - rank * b, 0), b), end)
        yield q, stop
        q = stop


Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]
"""A gather's labels [n], dense rows [n, dense] and one-hot ids [batches, features, b]."""


def join_first(carry: Arrays | None, arrays: Arrays, rows: int, b: int, whole: bool) -> Arrays:
    """The batch a previous span ended inside (`carry`: its labels, dense rows and ids [features,
    b], its first `rows` rows written) joined with the next span's first batch (`arrays`, rows
    `rows` on written), as (labels [b], dense [b, dense], ids [1, features, b]).

    The smaller share is copied: the carried rows into the span's batch, or, where the span wrote
    more than half of it and completes it (`whole`), the span's rows into the carried batch (a
    copy is ~2% of a span's gather at the default sizes, read and written out of cache)."""
    assert carry is not None, "a span starts inside a batch no earlier span began"
    labels, dense, values = arrays
    if whole and rows * 2 > b:
        carry[0][rows:] = labels[rows:b]
        carry[1][rows:] = dense[rows:b]
        carry[2][:, rows:] = values[0, :, rows:]
        return carry[0], carry[1], carry[2][None]
    labels[:rows] = carry[0][:rows]
    dense[:rows] = carry[1][:rows]
    values[0, :, :rows] = carry[2][:, :rows]
    return labels[:b], dense[:b], values[:1]


def carry_of(arrays: Arrays, batch: int, b: int) -> Arrays:
    """Batch `batch` of a span's arrays (labels, dense rows, ids), which the span ended inside."""
    labels, dense, values = arrays
    return labels[batch * b : (batch + 1) * b], dense[batch * b : (batch + 1) * b], values[batch]
