"""The global sample order: a pure function of (dataset, seed, epoch, global batch size).

The order never depends on world size, worker count or prefetch depth; ranks and workers
only choose which part of it to materialise. That is what makes digests comparable across
cluster sizes and lets a resume at another world size continue the same stream.

Shuffle (on by default) is two-level, so it stays I/O friendly on data far larger than RAM:

1. Each part is cut into blocks of `block_rows` consecutive rows (a part's last block may
   be short; blocks never straddle parts). The blocks are permuted with a generator seeded
   by (seed, epoch).
2. Consecutive runs of `window_blocks` permuted blocks form a window; the rows of a window
   are fully permuted with a generator seeded by (seed, epoch, window index).

The stream is the windows concatenated; global batch k is stream positions [k*G, (k+1)*G).
A batch therefore mixes rows from `window_blocks` random places of the dataset. The
defaults (128 blocks of 512 rows: a 64 K-row window, ~10 MB of Criteo-shaped columns) keep
a window in the CPU cache while batches are gathered from it: a window much larger than
the cache makes every row of every column a cache miss, and the loader 3-4x slower (measured
with `shardrec bench loader`). For data streamed from disk rather than the page cache, use
larger blocks (e.g. 65536 rows) so each block is one long sequential read.

Memory: the block table (16 bytes per block: 130 MB for 4.2 B rows at 512-row blocks, 2 MB
at 32 K-row blocks) plus one window's row permutation (8 bytes per window row). Shuffle
quality against a full permutation is measured by `shuffle_quality` and reported by
`shardrec bench loader`.

With shuffle off, the stream is the file order: parts in manifest order, rows in order.

Tail: with tail="drop" the last partial global batch is dropped; with tail="pad" it is
filled with rows taken from the start of the stream, and those padding rows are marked
(the loader gives them label -1.0 so the trainer can mask them out of loss and metrics).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

TAILS = ("drop", "pad")
DEFAULT_BLOCK_ROWS = 512
DEFAULT_WINDOW_BLOCKS = 128
_BLOCK_STREAM = 0xB10C
_WINDOW_STREAM = 0x5EED


@dataclass(frozen=True)
class OrderSpec:
    """Everything the global order depends on (and nothing it does not)."""

    part_rows: tuple[int, ...]
    """Rows of each part of the split, in manifest order."""
    global_batch_size: int
    seed: int = 0
    shuffle: bool = True
    tail: str = "drop"
    block_rows: int = DEFAULT_BLOCK_ROWS
    """Rows per shuffle block (consecutive rows of one part)."""
    window_blocks: int = DEFAULT_WINDOW_BLOCKS
    """Blocks whose rows are fully permuted together."""

    def __post_init__(self) -> None:
        if self.global_batch_size <= 0:
            raise ValueError(f"global_batch_size must be positive, got {self.global_batch_size}")
        if self.tail not in TAILS:
            raise ValueError(f"tail must be one of {', '.join(TAILS)}, got {self.tail!r}")
        if self.block_rows <= 0 or self.window_blocks <= 0:
            raise ValueError(f"block_rows and window_blocks must be positive, got {self.block_rows}, {self.window_blocks}")
        if any(r < 0 for r in self.part_rows):
            raise ValueError(f"part_rows must not be negative, got {self.part_rows}")

    @property
    def num_samples(self) -> int:
        return int(sum(self.part_rows))

    @property
    def num_batches(self) -> int:
        """Global batches per epoch (identical for every rank)."""
        n, g = self.num_samples, self.global_batch_size
        return n // g if self.tail == "drop" else -(-n // g)


@dataclass
class EpochOrder:
    """The order of one epoch; `rows(start, stop)` gives global row indices of stream positions.

    Keeps the last window it permuted, so consecutive batches cost one slice each.
    """

    spec: OrderSpec
    epoch: int
    _window_starts: np.ndarray = field(init=False, repr=False)
    _block_starts: np.ndarray = field(init=False, repr=False)
    _block_lens: np.ndarray = field(init=False, repr=False)
    _cached: tuple[int, np.ndarray] | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.epoch < 0:
            raise ValueError(f"epoch must not be negative, got {self.epoch}")
        if not self.spec.shuffle:
            return
        starts, lens = _blocks(self.spec.part_rows, self.spec.block_rows)
        perm = np.random.default_rng([self.spec.seed, self.epoch, _BLOCK_STREAM]).permutation(len(starts))
        self._block_starts, self._block_lens = starts[perm], lens[perm]
        m = self.spec.window_blocks
        window_rows = np.add.reduceat(self._block_lens, np.arange(0, len(perm), m)) if len(perm) else np.zeros(0, np.int64)
        self._window_starts = np.concatenate([[0], np.cumsum(window_rows)]).astype(np.int64)

    def _window(self, j: int) -> np.ndarray:
        # Prefetch threads ask for the same window at once: permute it once.
        with self._lock:
            if self._cached is None or self._cached[0] != j:
                self._cached = (j, self._permute_window(j))
            return self._cached[1]

    def _permute_window(self, j: int) -> np.ndarray:
        m = self.spec.window_blocks
        starts, lens = self._block_starts[j * m : (j + 1) * m], self._block_lens[j * m : (j + 1) * m]
        rows = _ranges(starts, lens)
        rng = np.random.default_rng([self.spec.seed, self.epoch, _WINDOW_STREAM, j])
        return rows[rng.permutation(len(rows))]

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Global row indices (int64) at stream positions [start, stop), 0 <= start <= stop <= N."""
        n = self.spec.num_samples
        assert 0 <= start <= stop <= n, (start, stop, n)
        if not self.spec.shuffle:
            return np.arange(start, stop, dtype=np.int64)
        pieces = []
        pos = start
        while pos < stop:
            j = int(np.searchsorted(self._window_starts, pos, side="right")) - 1
            w_start, w_stop = int(self._window_starts[j]), int(self._window_starts[j + 1])
            end = min(stop, w_stop)
            pieces.append(self._window(j)[pos - w_start : end - w_start])
            pos = end
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces) if pieces else np.zeros(0, np.int64)

    def batch(self, k: int) -> tuple[np.ndarray, int]:
        """Global batch k: (global row indices [G], number of real rows; the rest is padding)."""
        g, n = self.spec.global_batch_size, self.spec.num_samples
        if not 0 <= k < self.spec.num_batches:
            raise IndexError(f"batch {k} outside [0, {self.spec.num_batches})")
        start, stop = k * g, (k + 1) * g
        if stop <= n:
            return self.rows(start, stop), g
        # Padding rows repeat the start of the stream: real rows, so their ids are valid.
        real = self.rows(start, n)
        fill = self.rows(0, min(n, stop - n))
        while len(real) + len(fill) < g:  # only when the split is smaller than one global batch
            fill = np.concatenate([fill, self.rows(0, min(n, g - len(real) - len(fill)))])
        return np.concatenate([real, fill]), n - start


def _blocks(part_rows: tuple[int, ...], block_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Start row (global) and length of every block; blocks never straddle parts."""
    starts, lens = [], []
    offset = 0
    for rows in part_rows:
        s = np.arange(0, rows, block_rows, dtype=np.int64)
        starts.append(offset + s)
        lens.append(np.minimum(block_rows, rows - s))
        offset += rows
    if not starts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(starts), np.concatenate(lens).astype(np.int64)


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + l) for each (s, l), without a Python loop per row."""
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    ends = np.cumsum(lens)
    shift = np.repeat(starts - (ends - lens), lens)
    return np.arange(total, dtype=np.int64) + shift


def shuffle_quality(labels: np.ndarray, spec: OrderSpec, epoch: int = 0, full_trials: int = 4) -> dict[str, float]:
    """Spread of per-batch label means under this order, against a full permutation's.

    Returns the standard deviation of per-global-batch label means for the file order, this
    shuffle, and full random permutations (the ideal), and `ratio` = shuffle / full (1.0 is
    as good as a full permutation; the file order shows how much structure there is to break).
    """
    n, g = spec.num_samples, spec.global_batch_size
    if len(labels) != n:
        raise ValueError(f"{len(labels)} labels for {n} samples")
    k = n // g
    if k < 2:
        raise ValueError(f"need at least 2 global batches of {g} to measure spread, have {n} rows")
    labels = np.asarray(labels, dtype=np.float64)

    def spread(rows: np.ndarray) -> float:
        return float(labels[rows[: k * g]].reshape(k, g).mean(axis=1).std())

    shuffled = EpochOrder(spec, epoch).rows(0, n)
    rng = np.random.default_rng([spec.seed, epoch, 0xF011])
    full = float(np.mean([spread(rng.permutation(n)) for _ in range(full_trials)]))
    result = {"file_order_std": spread(np.arange(n)), "shuffle_std": spread(shuffled), "full_permutation_std": full}
    result["ratio"] = result["shuffle_std"] / full if full > 0 else float("nan")
    return result
