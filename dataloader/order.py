"""The global sample order: a pure function of (dataset, seed, epoch, global batch size).

The order never depends on world size, worker count or prefetch depth; ranks and workers
only choose which part of it to materialise. That is what makes digests comparable across
cluster sizes and lets a resume at another world size continue the same stream.

Shuffle (on by default) has three levels, so it mixes well, stays fast and keeps its
memory small however large the dataset:

1. Segments: each part is cut into segments of `segment_blocks * block_rows` consecutive
   rows (never straddling parts). Segments are permuted, seeded by (seed, epoch).
2. Groups: consecutive runs of `group_segments` permuted segments. A group's segments are
   cut into blocks of `block_rows` rows, and the group's blocks are permuted, seeded by
   (seed, epoch, group).
3. Windows: consecutive runs of `window_blocks` of a group's permuted blocks. A window's
   rows are fully permuted, seeded by (seed, epoch, group, window).

The stream is the windows concatenated; global batch k is stream positions [k*G, (k+1)*G).
With the defaults (256-row blocks, 256-block windows, 64 K-row segments, 256-segment
groups) a global batch of 8192 holds rows of ~256 blocks from ~256 segments, i.e. from
~256 random places of a 16 M-row stretch of a randomly ordered dataset. `shuffle_quality`
measures the effect (spread of per-batch label means against a full permutation's) and
`shardrec bench loader` reports it. Measured on 16 M rows whose click rate swings around
0.25 over 24 "hours" (as Criteo's does over a day), global batch 8192: with a swing of
+-0.05 the per-batch label-mean std is 1.08x a full permutation's (file order: 7.3x); with
+-0.10 it is 1.40x (file order: 15x). 32 K-row blocks, 32 per window (a typical block
shuffle) give 1.59x and 2.80x. What remains comes from the ~256 places per batch: smaller
blocks (block_rows=64, window_blocks=1024, segment_blocks=1024) mix finer.

Why windows are small (64 K rows, ~7 MB of Criteo-shaped columns): the loader gathers a
window's rows column by column, and a column's slice of a window then sits in the CPU cache
while it is read in random order. Windows much larger than the cache turn every row of
every column into a cache miss (3-4x slower, measured). Segments and groups are what
bring rows of far-apart places together.

Disk: a group's rows (16 M rows, ~1.9 GB of Criteo-shaped columns) are all read while the
group is current, in 256-row pieces; the kernel's read-around brings ~128 KB per page fault
and later windows of the group use it, as long as the page cache holds a group.

Memory: two entries per segment (16 bytes per 64 K rows: 1 MB for 4.2 B rows), one
group's block table (~65 K blocks) and one window's row permutation (64 K rows).

With shuffle off, the stream is the file order: parts in manifest order, rows in order.

Tail: with tail="drop" the last partial global batch is dropped; with tail="pad" it is
filled with rows taken from the start of the stream, and those padding rows are marked
(the loader gives them label -1.0 so the trainer can mask them out of loss and metrics).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass, field

import numpy as np

from shardrec.dataloader.util import pcg_shuffle

TAILS = ("drop", "pad")
DEFAULT_BLOCK_ROWS = 256
DEFAULT_WINDOW_BLOCKS = 256
DEFAULT_SEGMENT_BLOCKS = 256
DEFAULT_GROUP_SEGMENTS = 256
WINDOWS_KEPT = 3
"""Permuted windows an EpochOrder keeps (64 K rows, 0.5 MB each at the defaults)."""
_SEGMENT_STREAM = 0x5E6
_BLOCK_STREAM = 0xB10C
_WINDOW_STREAM = 0x5EED


@dataclass(frozen=True)
class ShuffleSpec:
    """How the stream is shuffled: on or off, the seed, and the three levels' sizes."""

    enabled: bool = True
    """False: the stream is the file order (the other fields then do not matter)."""
    seed: int = 0
    block_rows: int = DEFAULT_BLOCK_ROWS
    """Rows per shuffle block (consecutive rows of one part)."""
    window_blocks: int = DEFAULT_WINDOW_BLOCKS
    """Blocks whose rows are fully permuted together."""
    segment_blocks: int = DEFAULT_SEGMENT_BLOCKS
    """Blocks per segment, the unit of the dataset-wide permutation."""
    group_segments: int = DEFAULT_GROUP_SEGMENTS
    """Segments whose blocks are permuted together."""

    def __post_init__(self) -> None:
        for name in ("block_rows", "window_blocks", "segment_blocks", "group_segments"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


NO_SHUFFLE = ShuffleSpec(enabled=False)
"""The file order (evaluation, inspection)."""


@dataclass(frozen=True)
class OrderSpec:
    """Everything the global order depends on (and nothing it does not)."""

    part_rows: tuple[int, ...]
    """Rows of each part of the split, in manifest order."""
    global_batch_size: int
    tail: str = "drop"
    shuffle: ShuffleSpec = ShuffleSpec()

    def __post_init__(self) -> None:
        if self.global_batch_size <= 0:
            raise ValueError(f"global_batch_size must be positive, got {self.global_batch_size}")
        if self.tail not in TAILS:
            raise ValueError(f"tail must be one of {', '.join(TAILS)}, got {self.tail!r}")
        if not isinstance(self.shuffle, ShuffleSpec):  # a bool here would read as "shuffle on"
            raise TypeError(f"shuffle must be a ShuffleSpec, got {self.shuffle!r}")
        if any(r < 0 for r in self.part_rows):
            raise ValueError(f"part_rows must not be negative, got {self.part_rows}")

    @functools.cached_property
    def num_samples(self) -> int:
        # Cached: the order asks for it several times a batch, and Criteo 1TB has ~10,000 parts
        # (a sum over them each time was ~20% of the stream's time at 10,000 parts).
        return int(sum(self.part_rows))

    @property
    def num_batches(self) -> int:
        """Global batches per epoch (identical for every rank)."""
        n, g = self.num_samples, self.global_batch_size
        return n // g if self.tail == "drop" else -(-n // g)


@dataclass
class _Group:
    block_starts: np.ndarray  # global first row of each permuted block
    block_lens: np.ndarray
    window_starts: np.ndarray  # stream offsets inside the group, [windows + 1]


@dataclass
class EpochOrder:
    """The order of one epoch; `rows(start, stop)` gives global row indices of stream positions.

    Keeps the last group and window it built, so consecutive batches cost one slice each.
    Safe to share between prefetch threads.
    """

    spec: OrderSpec
    epoch: int
    _seg_starts: np.ndarray = field(init=False, repr=False)
    _seg_lens: np.ndarray = field(init=False, repr=False)
    _group_starts: np.ndarray = field(init=False, repr=False)
    _part_starts: np.ndarray = field(init=False, repr=False)
    _group: tuple[int, _Group] | None = field(default=None, init=False, repr=False)
    _windows: dict[tuple[int, int], np.ndarray] = field(
        default_factory=dict, init=False, repr=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.epoch < 0:
            raise ValueError(f"epoch must not be negative, got {self.epoch}")
        if not self.spec.shuffle.enabled:
            return
        s, mix = self.spec, self.spec.shuffle
        part_starts = (
            np.concatenate([[0], np.cumsum(s.part_rows, dtype=np.int64)[:-1]])
            if s.part_rows
            else np.zeros(0, np.int64)
        )
        starts, lens = _split(
            part_starts, np.asarray(s.part_rows, np.int64), mix.block_rows * mix.segment_blocks
        )
        perm = np.random.default_rng([mix.seed, self.epoch, _SEGMENT_STREAM]).permutation(
            len(starts)
        )
        self._seg_starts, self._seg_lens = starts[perm], lens[perm]
        self._group_starts = _run_starts(self._seg_lens, mix.group_segments)
        self._part_starts = part_starts

    def group_at(self, pos: int) -> int:
        """The shuffle group of stream position `pos` (0 with shuffle off: the file order has
        none)."""
        if not self.spec.shuffle.enabled:
            return 0
        return int(np.searchsorted(self._group_starts, pos, side="right")) - 1

    @property
    def num_groups(self) -> int:
        """Shuffle groups of the epoch (1 with shuffle off)."""
        return len(self._group_starts) - 1 if self.spec.shuffle.enabled else 1

    def group_parts(self, g: int) -> np.ndarray:
        """Indices of the parts whose rows shuffle group g reads (sorted; shuffle on only)."""
        return np.unique(self.group_spans(g)[0])

    def group_spans(self, g: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(part, first row inside it, rows) of each segment shuffle group g reads (shuffle on only):
        every row the group's batches hold lies in one of these spans."""
        s = self.spec.shuffle
        segs = slice(g * s.group_segments, (g + 1) * s.group_segments)
        starts, lens = self._seg_starts[segs], self._seg_lens[segs]
        parts = np.searchsorted(self._part_starts, starts, side="right") - 1
        return parts, starts - self._part_starts[parts], lens

    def _get_group(self, g: int) -> _Group:
        if self._group is None or self._group[0] != g:
            s = self.spec.shuffle
            segs = slice(g * s.group_segments, (g + 1) * s.group_segments)
            starts, lens = _split(self._seg_starts[segs], self._seg_lens[segs], s.block_rows)
            perm = np.random.default_rng([s.seed, self.epoch, _BLOCK_STREAM, g]).permutation(
                len(starts)
            )
            starts, lens = starts[perm], lens[perm]
            self._group = (g, _Group(starts, lens, _run_starts(lens, s.window_blocks)))
        return self._group[1]

    def _get_window(self, g: int, j: int) -> np.ndarray:
        # The last WINDOWS_KEPT windows: a batch that straddles two windows is read by the gathers
        # of both (window_spans.py), which would otherwise permute each window three times.
        rows = self._windows.get((g, j))
        if rows is None:
            s = self.spec.shuffle
            group = self._get_group(g)
            blocks = slice(j * s.window_blocks, (j + 1) * s.window_blocks)
            rows = _ranges(group.block_starts[blocks], group.block_lens[blocks])
            # numpy's default_rng(seed).permutation(rows), compiled (pcg_shuffle.py), in place.
            pcg_shuffle.shuffle(rows, [s.seed, self.epoch, _WINDOW_STREAM, g, j])
            if len(self._windows) >= WINDOWS_KEPT:
                del self._windows[next(iter(self._windows))]
            self._windows[(g, j)] = rows
        return rows

    def window_end(self, pos: int) -> int:
        """The stream position where the shuffle window holding position `pos` (< N) ends (shuffle
        on only): the loader reads whole windows together (window_spans.py)."""
        with self._lock:  # prefetch threads share the cached group
            g = self.group_at(pos)
            start = int(self._group_starts[g])
            w_starts = self._get_group(g).window_starts
            j = int(np.searchsorted(w_starts, pos - start, side="right"))
            return start + int(w_starts[j])

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Global row indices (int64) at stream positions [start, stop), 0 <= start <= stop <= N."""
        n = self.spec.num_samples
        assert 0 <= start <= stop <= n, (start, stop, n)
        if not self.spec.shuffle.enabled:
            return np.arange(start, stop, dtype=np.int64)
        pieces = []
        pos = start
        with self._lock:  # prefetch threads share the cached group and window
            while pos < stop:
                g = self.group_at(pos)
                local = pos - int(self._group_starts[g])
                w_starts = self._get_group(g).window_starts
                j = int(np.searchsorted(w_starts, local, side="right")) - 1
                w_start, w_stop = int(w_starts[j]), int(w_starts[j + 1])
                end = min(stop - pos, w_stop - local)
                pieces.append(self._get_window(g, j)[local - w_start : local - w_start + end])
                pos += end
        if not pieces:
            return np.zeros(0, np.int64)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

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


def _split(starts: np.ndarray, lens: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut each range [start, start + len) into pieces of `size` rows (the last may be short)."""
    counts = -(-lens // size)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    first = np.cumsum(counts) - counts
    k = np.arange(total, dtype=np.int64) - np.repeat(first, counts)  # piece index inside its range
    piece_starts = np.repeat(starts, counts) + k * size
    piece_lens = np.minimum(size, np.repeat(starts + lens, counts) - piece_starts)
    return piece_starts.astype(np.int64), piece_lens.astype(np.int64)


def _run_starts(lens: np.ndarray, run: int) -> np.ndarray:
    """Offsets of consecutive runs of `run` items of the given lengths: [runs + 1]."""
    if len(lens) == 0:
        return np.zeros(1, np.int64)
    sums = np.add.reduceat(lens, np.arange(0, len(lens), run))
    return np.concatenate([[0], np.cumsum(sums)]).astype(np.int64)


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + l) for each (s, l), without a Python loop per row."""
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    ends = np.cumsum(lens)
    shift = np.repeat(starts - (ends - lens), lens)
    return np.arange(total, dtype=np.int64) + shift


def shuffle_quality(
    labels: np.ndarray, spec: OrderSpec, epoch: int = 0, full_trials: int = 4
) -> dict[str, float]:
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
    rng = np.random.default_rng([spec.shuffle.seed, epoch, 0xF011])
    full = float(np.mean([spread(rng.permutation(n)) for _ in range(full_trials)]))
    result = {
        "file_order_std": spread(np.arange(n)),
        "shuffle_std": spread(shuffled),
        "full_permutation_std": full,
    }
    result["ratio"] = result["shuffle_std"] / full if full > 0 else float("nan")
    return result
