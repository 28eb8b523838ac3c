"""The parts of one split, mapped on first use and at most `capacity` of them at a time.

A part is one file, mapped whole (part_file.py). A Criteo-1TB-sized dataset has ~10,000 parts:
10,000 maps, under the kernel's per-process limit (vm.max_map_count, 65,530 by default), but
maps are not free and the loader never needs them all at once: the shuffle (order.py) reads one
group of 256 segments at a time, so a gather touches at most ~256 parts, and without shuffle
parts are read one after another. `PartSet` keeps the most recently used parts mapped and maps
the others again when they come back: all sets of the process together keep their maps under
half the kernel's limit (32 K maps), a set may be bounded further (`capacity`), and the shuffle
unmaps a group's parts when the stream leaves it (`release`).

An evicted part is unmapped only once nothing uses it: its arrays own their maps
(dataloader/util/mapping.py), so a gather still holding a part or one of its columns keeps it valid, on
any thread. Maps hold no file descriptor, so neither the open-file limit nor the part
count bounds what a split may hold.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from pathlib import Path

from shardrec.dataloader.format.manifest import DatasetError, Manifest
from shardrec.dataloader.format.part_file import (
    DENSE,
    LABEL,
    Part,
    check_part_file,
    manifest_layout,
    open_part,
)
from shardrec.dataloader.util.mapping import read_ahead_spans

DEFAULT_MAX_MAP_COUNT = 65530
MAP_SHARE = 2
"""All PartSets of the process together keep their maps under 1/MAP_SHARE of vm.max_map_count
(torch, numba and the rest of the process map files and memory too)."""


def max_map_count() -> int:
    try:
        return int(Path("/proc/sys/vm/max_map_count").read_text())
    except (OSError, ValueError):
        return DEFAULT_MAX_MAP_COUNT


class _Budget:
    """The maps of every PartSet of the process, least recently used first: a trainer holds a
    loader per split, a benchmark several per dataset, and only together must they stay under
    the kernel's limit. One lock serves all sets (a lookup is a dict move; opening a part,
    rare, is the only slow thing done under it)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        # (set id, part index) -> part key, least recently used first; a part that several sets
        # share counts once (refs: entries per part key). A part is one map.
        self.order: OrderedDict[tuple[int, int], tuple] = OrderedDict()
        self.refs: dict[tuple, int] = {}
        self.sets: weakref.WeakValueDictionary[int, PartSet] = weakref.WeakValueDictionary()
        self.parts: weakref.WeakValueDictionary[tuple, Part] = weakref.WeakValueDictionary()
        """Every mapped part alive in the process by (dataset, split, part, checksums): two
        loaders of one split share one map of each part (a benchmark's shuffled and ordered
        loaders, a resume check), and a part evicted from one set but held by another comes
        back without a new map."""
        self.maps = 0
        self.limit = max_map_count() // MAP_SHARE

    def add(self, entry: tuple[int, int], key: tuple) -> None:
        self.order[entry] = key
        count = self.refs.get(key, 0)
        self.refs[key] = count + 1
        self.maps += count == 0
        while self.maps > self.limit and len(self.order) > 1:
            oldest = next(iter(self.order))
            owner = self.sets.get(oldest[0])
            if owner is None:
                self.drop(oldest)
            else:
                owner._evict(oldest[1])

    def drop(self, entry: tuple[int, int]) -> None:
        key = self.order.pop(entry, None)
        if key is None:
            return
        self.refs[key] -= 1
        if self.refs[key] == 0:
            del self.refs[key]
            self.maps -= 1

    def forget(self, set_id: int) -> None:
        """A PartSet is gone: its maps go with its parts."""
        with self.lock:
            for key in [k for k in self.order if k[0] == set_id]:
                self.drop(key)


_BUDGET = _Budget()
_IDS = itertools.count()


class PartSet(Sequence[Part]):
    """A split's parts by index (`parts[i]` maps part i if it is not mapped), rows known without
    mapping."""

    def __init__(
        self, directory: str | Path, split: str, manifest: Manifest, capacity: int | None = None
    ) -> None:
        """Check every part's file now (inside the dataset, sizes; DatasetError names the first
        bad one), and each part's dtypes and shapes when it is first mapped. `capacity`: parts this
        set keeps mapped at most (None: only the process-wide map budget bounds it)."""
        self.directory = Path(directory)
        if split not in manifest.splits:
            raise DatasetError(
                f"{directory}: no split {split!r} (has {', '.join(manifest.splits) or 'none'})"
            )
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be at least 1 part, got {capacity}")
        self.split, self.manifest, self.capacity = split, manifest, capacity
        self._infos = manifest.splits[split].parts
        self.rows: tuple[int, ...] = tuple(int(p.rows) for p in self._infos)
        self._mapped: OrderedDict[int, Part] = OrderedDict()
        root = str(self.directory.resolve())
        self._keys = [(root, split, p.name, p.sha256) for p in self._infos]
        self.layout = manifest_layout(manifest, self.directory)
        """The file layout every part of the split must have (checked as each is opened)."""
        self._id = next(_IDS)
        _BUDGET.sets[self._id] = self
        weakref.finalize(self, _BUDGET.forget, self._id)
        self.opens = 0
        """Parts this set opened and mapped so far, first opening included (a measure of
        eviction churn; a part another set had mapped is not counted)."""
        self.warm_cpu_s = 0.0
        """CPU seconds the warmer threads (`warm`) spent so far: the stream's cost off its own
        thread."""
        self._warm_lock = threading.Lock()
        self.generation = 0
        """Counts the evictions so far: a gatherer that holds parts between gathers
        (addresses.HeldParts) lets them go when it changes, so the set's bounds hold."""
        # Every part's file is checked now (exists inside the dataset, manifest's size), the
        # first part is mapped (its layout is the gathers' reference), the others when first read
        # (their metadata checked then).
        for info in self._infos:
            check_part_file(self.directory, split, info)
        if self._infos:
            self[0]

    def __len__(self) -> int:
        return len(self._infos)

    def __getitem__(self, index: int) -> Part:  # type: ignore[override]
        i = index + len(self._infos) if index < 0 else index
        if not 0 <= i < len(self._infos):
            raise IndexError(f"part {index} outside [0, {len(self._infos)})")
        with _BUDGET.lock:
            part = self._mapped.get(i)
            if part is not None:
                self._mapped.move_to_end(i)
                _BUDGET.order.move_to_end((self._id, i))
                return part
            part = _BUDGET.parts.get(self._keys[i])
            if part is not None:
                return self._insert(i, part)
        # Opened outside the lock: the gathers' lookups of mapped parts, on other threads, need not
        # wait while a part of the next shuffle group is opened (warm).
        opened = open_part(self.directory, self.split, self._infos[i], self.manifest, self.layout)
        with _BUDGET.lock:
            part = self._mapped.get(i)
            part = _BUDGET.parts.get(self._keys[i]) if part is None else part
            if part is None:  # else another thread was first: its maps serve, ours go with `opened`
                part = _BUDGET.parts[self._keys[i]] = opened
                self.opens += 1
            return part if i in self._mapped else self._insert(i, part)

    def hold(self, indices: Sequence[int]) -> list[Part]:
        """Parts `indices` (`[self[i] for i in indices]`), the mapped ones looked up under one
        lock: a gather of a shuffle window holds ~250 parts at Criteo 1TB's part size, and a
        lock per part was a visible share of its time."""
        held: list[Part | None] = []
        with _BUDGET.lock:
            for i in indices:
                part = self._mapped.get(i)
                if part is not None:
                    self._mapped.move_to_end(i)
                    _BUDGET.order.move_to_end((self._id, i))
                held.append(part)
        return [self[i] if part is None else part for i, part in zip(indices, held)]

    def _insert(self, i: int, part: Part) -> Part:
        """Count part i as mapped by this set (most recently used). Under the budget's lock."""
        self._mapped[i] = part
        if self.capacity is not None and len(self._mapped) > self.capacity:
            self._evict(next(iter(self._mapped)))
        _BUDGET.add((self._id, i), self._keys[i])
        return part

    def warm(
        self, spans: Iterable[tuple[int, int, int]], wanted: Callable[[], bool] = lambda: True
    ) -> None:
        """Map the parts of `spans` (part, first row, rows) and read those rows of their columns
        ahead (mapping.read_ahead_spans), while `wanted()`: run on a background thread for the next
        shuffle group, it takes the opening of parts out of the gathers, and a dataset on disk
        is read before they need it."""
        cpu = time.thread_time()
        try:
            for i, start, rows in spans:
                if not wanted():
                    return
                # let the gathers' thread take the GIL between parts
                time.sleep(0)
                part = self[i]  # held while its spans are read ahead: they are its maps' addresses
                read_ahead_spans(_spans(part, start, rows), probe=part.residency_known)
        finally:
            with self._warm_lock:  # a warmer that fell behind may still finish beside the next one
                self.warm_cpu_s += time.thread_time() - cpu

    def _evict(self, i: int) -> None:
        """Drop part i's maps (unmapped once no gather holds the part). Under the budget's lock."""
        if self._mapped.pop(i, None) is not None:
            self.generation += 1
        _BUDGET.drop((self._id, i))

    def release(self, keep: Collection[int]) -> None:
        """Unmap every part but `keep` (once no gather holds it): the shuffle calls it when the
        stream enters a new group, whose parts are `keep` (in file order: the parts from the
        current one on). A mapped part keeps the pages it was
        read through resident in the process (file-backed, counted in its RSS) until it is
        unmapped: with only the map budget to evict them, the RSS grew by ~2 GB a group."""
        keep = keep if isinstance(keep, range) else set(keep)
        with _BUDGET.lock:
            for i in [i for i in self._mapped if i not in keep]:
                self._evict(i)

    def __iter__(self) -> Iterator[Part]:
        return (self[i] for i in range(len(self._infos)))

    def holds(self, index: int) -> bool:
        """Whether part `index` is mapped by the set now."""
        return index in self._mapped

    @property
    def mapped(self) -> int:
        """Parts mapped by the set now (a gather may still hold evicted ones)."""
        return len(self._mapped)


def _spans(part: Part, start: int, rows: int) -> list[tuple[int, int]]:
    """(address, bytes) of rows [start, start + rows) in each column of `part` (a list feature:
    its offsets; its values are read as the gathers find them)."""
    if part.read_spans:  # the opening's, reckoned once per part shape
        base = part.map_address
        return [
            (base + at + start * size, (rows + extra) * size) for at, size, extra in part.read_spans
        ]
    columns = [(LABEL, part.labels, rows, False), (DENSE, part.dense, rows, False)]
    columns += [(n, c, rows, False) for n, c in part.sparse.items() if n not in part.offsets]
    columns += [(n, o, rows + 1, True) for n, o in part.offsets.items()]
    return [
        (part.column_address(name, c, offsets) + start * c.strides[0], count * c.strides[0])
        for name, c, count, offsets in columns
        if c.size
    ]


def part_rows(parts: Sequence[Part]) -> tuple[int, ...]:
    """Rows of each part, without mapping a PartSet's parts."""
    return parts.rows if isinstance(parts, PartSet) else tuple(p.rows for p in parts)
