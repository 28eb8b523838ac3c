"""Which parts of a split a stream keeps memory-mapped as it crosses shuffle groups (in file order:
parts), and the next group's parts mapped and read ahead on a background thread.

Left parts are unmapped: their pages stay in the page cache, but while mapped they count in the
process's RSS, which then grew with every group the stream crossed (part_cache.PartSet.release).
At Criteo 1TB's part size a group reads ~250 parts it must open, and opening them inside the
gathers was most of what made the stream slower than one part (`shardrec bench scale` measures
it), so the next group's parts are opened while this one streams.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Sequence

import numpy as np

from shardrec.dataloader.format.part_cache import PartSet
from shardrec.dataloader.format.part_file import Part
from shardrec.dataloader.order import EpochOrder

logger = logging.getLogger(__name__)
WARM_THREAD = "shardrec-warm"
"""The name of the threads that warm the next shuffle group (benchmarks wait for them)."""


class GroupMaps:
    """The shuffle group (epoch, group) a loader's gathers are in, and the parts it keeps mapped."""

    def __init__(self, parts: Sequence[Part], rank_offset: int) -> None:
        """parts: the split's (a PartSet maps them as they are used; a list is mapped whole);
        rank_offset: this rank's first row in a global batch (file order finds its part by it)."""
        self.parts, self.rank_offset = parts, rank_offset
        self._group: tuple[int, int] = (-1, -1)  # (epoch, shuffle group) whose parts stay mapped
        self._lock = threading.Lock()
        self._part_ends: np.ndarray | None = None  # file order: the row after each part

    def start_over(self) -> None:
        """A pass starts its groups over: an eval loader goes over epoch 0 at every evaluation,
        and its later passes, never past the first's last group, released no part."""
        with self._lock:
            self._group = (-1, -1)

    def enter(self, order: EpochOrder, start: int) -> Callable[[], None] | None:
        """Unmap the parts the stream has left when a gather from stream position `start` starts a
        later shuffle group (or, in file order, a later part); a callable that starts mapping the
        next group's parts, to call once the gather is done (its opening must not share the GIL
        with it), or None."""
        parts = self.parts
        if not isinstance(parts, PartSet):
            return None
        if order.spec.shuffle.enabled:
            group = (order.epoch, order.group_at(start))
        else:
            if self._part_ends is None:
                self._part_ends = np.cumsum(parts.rows)
            part = np.searchsorted(self._part_ends, start + self.rank_offset, side="right")
            group = (order.epoch, int(part))
        with self._lock:
            # Prefetch threads may finish runs out of order: only a later group releases.
            if group <= self._group and group[0] == self._group[0]:
                return None
            self._group = group
        if not order.spec.shuffle.enabled:
            parts.release(range(group[1], len(parts)))
            return None
        keep = set(order.group_parts(group[1]).tolist())
        warm = None
        following = group[1] + 1
        if following < order.num_groups:
            spans = order.group_spans(following)
            keep.update(spans[0].tolist())
            if parts.capacity is None or len(keep) <= parts.capacity:
                rows = list(zip(*(a.tolist() for a in spans)))
                warm = functools.partial(self._warm_next, parts, group, rows)
        parts.release(keep)
        return warm

    def _warm_next(
        self, parts: PartSet, group: tuple[int, int], spans: list[tuple[int, int, int]]
    ) -> None:
        """Map the next shuffle group's parts and read its rows ahead on a background thread."""

        # Only while the stream is still in `group` (a warmer that fell behind would map parts the
        # stream has released again) and the process is not exiting (it would wait for the read).
        def wanted() -> bool:
            return self._group == group and threading.main_thread().is_alive()

        threading.Thread(target=_warm, args=(parts, spans, wanted), name=WARM_THREAD).start()


def _warm(parts: PartSet, spans: list[tuple[int, int, int]], wanted: Callable[[], bool]) -> None:
    try:
        parts.warm(spans, wanted)
    except Exception:  # a bad part: the gather that reads it raises the error where it belongs
        logger.debug("warming the next shuffle group's parts failed", exc_info=True)
