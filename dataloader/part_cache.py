"""The parts of one split, mapped on first use and at most `capacity` of them at a time.

A Criteo-1TB-sized dataset has ~10,000 parts of 28 column files each: 280 K maps, past the
kernel's per-process limit (vm.max_map_count, 65,530 by default). The loader never needs
them all at once: the shuffle (order.py) reads one group of 256 segments at a time, so a
gather touches at most ~256 parts, and without shuffle parts are read one after another.
`PartSet` keeps the most recently used `capacity` parts mapped (default: what a quarter of
the map limit allows, 585 Criteo parts) and maps the others again when they come back.

An evicted part is unmapped only once nothing uses it: its arrays own their maps
(mapping.py), so a gather still holding a part or one of its columns keeps it valid, on
any thread. Maps hold no file descriptor, so neither the open-file limit nor the part
count bounds what a split may hold.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Iterator, Sequence

from shardrec.dataloader.format import DatasetError, Manifest, Part, open_part

DEFAULT_MAX_MAP_COUNT = 65530
MAP_SHARE = 4
"""The loader keeps its maps under 1/MAP_SHARE of vm.max_map_count (torch, numba and
the rest of the process map files and memory too)."""


def default_capacity(files_per_part: int, max_map_count: int | None = None) -> int:
    """How many parts of `files_per_part` column files fit in 1/MAP_SHARE of the map limit."""
    if max_map_count is None:
        try:
            max_map_count = int(Path("/proc/sys/vm/max_map_count").read_text())
        except (OSError, ValueError):
            max_map_count = DEFAULT_MAX_MAP_COUNT
    return max(2, max_map_count // MAP_SHARE // max(files_per_part, 1))


class PartSet(Sequence[Part]):
    """A split's parts by index (`parts[i]` maps part i if it is not mapped), rows known without mapping."""

    def __init__(self, directory: str | Path, split: str, manifest: Manifest, capacity: int | None = None) -> None:
        """Check every part now, as opening a split always has (files inside the dataset, sizes,
        dtypes, shapes; DatasetError names the first bad one), keeping the last `capacity` mapped."""
        self.directory = Path(directory)
        if split not in manifest.splits:
            raise DatasetError(f"{directory}: no split {split!r} (has {', '.join(manifest.splits) or 'none'})")
        self.split, self.manifest = split, manifest
        self._infos = manifest.splits[split].parts
        self.rows: tuple[int, ...] = tuple(int(p.rows) for p in self._infos)
        files = max((len(p.files) for p in self._infos), default=1)
        self.capacity = default_capacity(files) if capacity is None else capacity
        if self.capacity < 1:
            raise ValueError(f"capacity must be at least 1 part, got {self.capacity}")
        self._mapped: OrderedDict[int, Part] = OrderedDict()
        self._lock = threading.Lock()  # prefetch workers gather on several threads
        self.opens = 0
        """Parts mapped so far, first opening included (a measure of eviction churn)."""
        for i in range(len(self._infos)):
            self[i]

    def __len__(self) -> int:
        return len(self._infos)

    def __getitem__(self, index: int) -> Part:  # type: ignore[override]
        i = index + len(self._infos) if index < 0 else index
        if not 0 <= i < len(self._infos):
            raise IndexError(f"part {index} outside [0, {len(self._infos)})")
        with self._lock:
            part = self._mapped.get(i)
            if part is not None:
                self._mapped.move_to_end(i)
                return part
            part = open_part(self.directory, self.split, self._infos[i], self.manifest)
            self.opens += 1
            self._mapped[i] = part
            while len(self._mapped) > self.capacity:
                self._mapped.popitem(last=False)
            return part

    def __iter__(self) -> Iterator[Part]:
        return (self[i] for i in range(len(self._infos)))

    @property
    def mapped(self) -> int:
        """Parts mapped by the set now (a gather may still hold evicted ones)."""
        return len(self._mapped)


def part_rows(parts: Sequence[Part]) -> tuple[int, ...]:
    """Rows of each part, without mapping a PartSet's parts."""
    return parts.rows if isinstance(parts, PartSet) else tuple(p.rows for p in parts)
