"""The global order of an event-log split: windows in time order, a pure function of (dataset,
seed, epoch, global batch size), never of the world size.

Each window's anchors come in the timeline's order (by user, then event: the reference's order
within a day), or shuffled within the window (seeded by (seed, epoch, window)) with `shuffle`.
Global batch k of the epoch is G consecutive anchors of one window: window w gives
floor(n_w / G) batches (tail "drop": the reference drops each window's last n_w mod G anchors) or
ceil(n_w / G) (tail "pad": the last one filled with anchors from the window's start, marked as
padding). Rank r takes rows [r B, (r + 1) B) of each global batch, as the row loader does, so the
global batches and their digests are the same at any world size, and a resume that names the
batch reached continues bit for bit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

TAILS = ("drop", "pad")
_WINDOW_STREAM = 0x717E


@dataclass(frozen=True)
class TemporalSpec:
    """Everything the order depends on."""

    window_offsets: tuple[int, ...]
    """Where each window starts in the split's timeline, then its end."""
    global_batch_size: int
    tail: str = "drop"
    shuffle: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.global_batch_size <= 0:
            raise ValueError(f"global_batch_size must be positive, got {self.global_batch_size}")
        if self.tail not in TAILS:
            raise ValueError(f"tail must be one of {', '.join(TAILS)}, got {self.tail!r}")

    @functools.cached_property
    def window_sizes(self) -> np.ndarray:
        return np.diff(np.asarray(self.window_offsets, dtype=np.int64))

    @functools.cached_property
    def batches_per_window(self) -> np.ndarray:
        g = self.global_batch_size
        if self.tail == "drop":
            return self.window_sizes // g
        return -(-self.window_sizes // g)

    @functools.cached_property
    def first_batch(self) -> np.ndarray:
        """Global batch index where each window starts, then the epoch's count."""
        return np.concatenate([[0], np.cumsum(self.batches_per_window)]).astype(np.int64)

    @property
    def num_batches(self) -> int:
        return int(self.first_batch[-1])

    @property
    def num_samples(self) -> int:
        return int(self.window_sizes.sum())


class TemporalOrder:
    """One epoch of the order: global batch k -> timeline rows."""

    def __init__(self, spec: TemporalSpec, epoch: int) -> None:
        self.spec, self.epoch = spec, epoch
        self._cached: tuple[int, np.ndarray] | None = None

    def window_of(self, k: int) -> int:
        return int(np.searchsorted(self.spec.first_batch, k, side="right") - 1)

    def _window_rows(self, w: int) -> np.ndarray:
        """The timeline rows of window w in this epoch's order."""
        if self._cached is not None and self._cached[0] == w:
            return self._cached[1]
        start = self.spec.window_offsets[w]
        rows = np.arange(start, self.spec.window_offsets[w + 1], dtype=np.int64)
        if self.spec.shuffle:
            rng = np.random.default_rng([self.spec.seed, self.epoch, w, _WINDOW_STREAM])
            rows = rows[rng.permutation(len(rows))]
        self._cached = (w, rows)
        return rows

    def batch(self, k: int) -> tuple[np.ndarray, int]:
        """(timeline rows [G] of global batch k, how many are real: the rest are padding)."""
        if not 0 <= k < self.spec.num_batches:
            raise IndexError(f"batch {k} outside [0, {self.spec.num_batches})")
        w = self.window_of(k)
        g = self.spec.global_batch_size
        rows = self._window_rows(w)
        lo = (k - int(self.spec.first_batch[w])) * g
        chunk = rows[lo : lo + g]
        real = len(chunk)
        if real < g:  # tail "pad": the window's first anchors again
            chunk = np.concatenate([chunk, np.resize(rows, g - real)])
        return chunk, real
