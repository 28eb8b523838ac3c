"""Batches for one rank: `build_loader(...)` -> `BatchLoader`, an iterable of torchrec `Batch`.

Contract (what the trainer relies on):

- The sequence of global batches is a pure function of (dataset, seed, epoch, global batch
  size); see dataloader/order.py. World size, workers and prefetch depth never change it.
- Rank r of W gets rows [r*B, (r+1)*B) of each global batch, B = global_batch_size // W.
- Every rank yields `len(loader)` batches per epoch. tail="drop" drops the last partial
  global batch; tail="pad" fills it with real rows from the start of the stream whose label
  is -1.0 (PAD_LABEL): the trainer masks label < 0 out of loss and metrics.
- A Batch holds dense_features float32 [B, num_dense], labels float32 [B] and
  sparse_features, a KeyedJaggedTensor keyed by the manifest's feature names in manifest
  order with int64 values (one id per row for one-hot features, jagged for multi-hot).
- A split with no rows is an error; so is one with fewer rows than one global batch under
  tail="drop" (it would yield nothing). Under tail="pad" it yields one padded batch.
- `state_dict()` / `load_state_dict()` follow the torchdata StatefulDataLoader protocol: the
  state says how many global samples of which epoch were yielded; loading it makes the next
  `iter()` continue right after them (at any world size with the same global batch), and a
  later `iter()` starts its epoch from the beginning again. `set_epoch(e)` chooses the epoch
  (it keeps a loaded position only if that position is of epoch e).
- `Delivery.num_workers` > 0 makes batches on background threads (dataloader/prefetch.py), up
  to `prefetch` runs per worker ahead; for a CUDA `device` (or `pin_memory`), batches are pinned
  there and copied with non_blocking=True.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchrec.datasets.utils import Batch

from shardrec.dataloader.event_loader import EventLoader, build_event_loader
from shardrec.dataloader.events.event_files import EVENTS_DIR
from shardrec.dataloader.format.manifest import MANIFEST, DatasetError, Manifest
from shardrec.dataloader.format.source import SplitSource, open_source
from shardrec.dataloader.gather.batch import PAD_LABEL, BatchGatherer
from shardrec.dataloader.group_maps import GroupMaps
from shardrec.dataloader.multihot.multihot_tables import (
    IndexTables,
    MultiHotOption,
    multihot_source,
)
from shardrec.dataloader.order import NO_SHUFFLE, EpochOrder, OrderSpec, ShuffleSpec
from shardrec.dataloader.prefetch import prefetch_map
from shardrec.dataloader.window_spans import carry_of, join_first, window_spans

logger = logging.getLogger(__name__)

STATE_VERSION = 1
ROWS_PER_GATHER = 1 << 16
__all__ = ["NO_SHUFFLE", "PAD_LABEL", "BatchLoader", "Delivery", "ShuffleSpec", "build_loader"]


@dataclass(frozen=True)
class Delivery:
    """How batches are made and handed over; never which rows they hold (the order's job)."""

    num_workers: int = 0
    """Prefetch threads (0: batches are made on `next()`)."""
    prefetch: int = 2
    """Runs of batches queued ahead per worker (a run is ~gather_rows rows of this rank:
    ~17 MB for Criteo-shaped data at the default)."""
    pin_memory: bool | None = None
    """Pin batches (None: when `device` is a CUDA device). A CPU job never pins: pinning makes a
    CUDA context on GPU 0 wherever CUDA exists."""
    device: torch.device | str | None = None
    """If set, batches are moved there (non-blocking from pinned memory)."""
    gather_rows: int = ROWS_PER_GATHER
    """Rows of this rank gathered in one go (consecutive batches; memory ~260 B/row). A shuffled
    stream's compiled gathers read whole shuffle windows instead, at least half of this many
    rows (window_spans.py)."""
    compiled: bool | None = None
    """Gather with the numba kernels (None: when numba imports; False: numpy only, the same
    batches, slower; dataloader/gather/gather_kernels.py)."""
    max_mapped_parts: int | None = None
    """Parts kept memory-mapped at once (None: all loaders of the process share half the
    kernel's map limit, ~1,170 Criteo parts; others are mapped again as the stream reaches
    them; part_cache.py)."""

    def __post_init__(self) -> None:
        if self.num_workers < 0:
            raise ValueError(f"num_workers must not be negative, got {self.num_workers}")
        if self.max_mapped_parts is not None and self.max_mapped_parts < 1:
            raise ValueError(f"max_mapped_parts must be at least 1, got {self.max_mapped_parts}")


class BatchLoader:
    """This rank's slice of each global batch of one split, one epoch per `iter()`."""

    def __init__(
        self,
        source: SplitSource,
        spec: OrderSpec,
        *,
        rank: int,
        world_size: int,
        epoch: int = 0,
        delivery: Delivery = Delivery(),
        index_tables: IndexTables | None = None,
    ) -> None:
        self.source = source
        self.spec = spec
        self.rank, self.world_size = rank, world_size
        self.local_batch_size = spec.global_batch_size // world_size
        self.num_workers, self.prefetch = delivery.num_workers, delivery.prefetch
        self.device = torch.device(delivery.device) if delivery.device is not None else None
        to_cuda = self.device is not None and self.device.type == "cuda"
        self.pin_memory = to_cuda if delivery.pin_memory is None else delivery.pin_memory
        self.num_samples: int = spec.num_samples
        """Real (unpadded) samples in the split."""
        self._gatherer = BatchGatherer(
            source.parts,
            source.feature_names,
            source.multi_hot,
            source.modulo,
            delivery.compiled,
            index_tables,
        )
        self._order: EpochOrder | None = None
        # Batches gathered together: about one shuffle window of this rank's rows (see batch.py).
        self._run_batches = max(1, delivery.gather_rows // self.local_batch_size)
        self._cached_run: tuple[tuple[int, int], list[Batch]] | None = None
        self._maps = GroupMaps(source.parts, rank * self.local_batch_size)
        self.epoch = epoch
        self._offset = 0  # global samples of self.epoch yielded so far
        self._resume_pending = False

    @property
    def feature_names(self) -> list[str]:
        return self.source.feature_names

    def __len__(self) -> int:
        return self.spec.num_batches

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next `iter()` yields (a loaded position of this epoch is kept)."""
        if epoch < 0:
            raise ValueError(f"epoch must not be negative, got {epoch}")
        if epoch != self.epoch:
            if self._resume_pending:
                logger.info(
                    "set_epoch(%d) drops the loaded position in epoch %d", epoch, self.epoch
                )
            self.epoch, self._offset, self._resume_pending = epoch, 0, False

    def _epoch_order(self) -> EpochOrder:
        if self._order is None or self._order.epoch != self.epoch:
            self._order = EpochOrder(self.spec, self.epoch)
        return self._order

    def rows(self, k: int, order: EpochOrder | None = None) -> tuple[np.ndarray, int]:
        """Global row indices of this rank's slice of global batch k, and how many are real."""
        rows, real = (order or self._epoch_order()).batch(k)
        b, r = self.local_batch_size, self.rank
        return rows[r * b : (r + 1) * b], min(max(real - r * b, 0), b)

    def _run(self, first: int, order: EpochOrder | None = None) -> list[Batch]:
        """This rank's slices of global batches first .. first + run - 1, gathered together."""
        order = order or self._epoch_order()
        warm = self._maps.enter(order, first * self.spec.global_batch_size)
        stop = min(first + self._run_batches, len(self))
        batches = self._gatherer.gather_many([self.rows(k, order) for k in range(first, stop)])
        if (
            warm is not None
        ):  # after this run: its parts' opening must not share the GIL with the warmer
            warm()
        return [b.pin_memory() for b in batches] if self.pin_memory else batches

    def _gather_span(self, span: tuple[int, int], order: EpochOrder) -> tuple:
        """This rank's rows at its positions span = [q0, q1) (window_spans.py), gathered into
        their batches' places: (labels, dense, ids) of the batches the span meets, and the count
        of real rows of each."""
        (q0, q1), b = span, self.local_batch_size
        k0, k1 = q0 // b, -(-q1 // b)
        warm = self._maps.enter(order, k0 * self.spec.global_batch_size + self.rank * b + q0 % b)
        pieces, reals = [], []
        for k in range(k0, k1):
            rows, real = self.rows(k, order)
            pieces.append(rows[max(q0 - k * b, 0) : min(q1 - k * b, b)])
            reals.append(real)
        rows = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        arrays = self._gatherer.gather_span(rows, q0 - k0 * b, k1 - k0, b)
        if warm is not None:
            warm()
        return span, arrays, reals

    def batch(self, k: int) -> Batch:
        """This rank's slice of global batch k of the current epoch (random access)."""
        if not 0 <= k < len(self):
            raise IndexError(f"batch {k} outside [0, {len(self)})")
        first = k - k % self._run_batches
        cached = self._cached_run
        if cached is None or cached[0] != (self.epoch, first):
            cached = self._cached_run = ((self.epoch, first), self._run(first))
        return cached[1][k - first]

    def __iter__(self) -> Iterator[Batch]:
        if not self._resume_pending:
            self._offset = 0
        self._resume_pending = False
        self._maps.start_over()
        start = self._offset // self.spec.global_batch_size
        # The workers share this epoch's order, built here once (a later set_epoch cannot touch it).
        order, gatherer = self._epoch_order(), self._gatherer
        if self.spec.shuffle.enabled and gatherer.compiled and not gatherer.multi_hot:
            return self._deliver(self._span_batches(start, order), start)
        return self._deliver(self._run_batches_from(start, order), start)

    def _deliver(self, batches: Iterator[Batch], start: int) -> Iterator[Batch]:
        """Batches start, start + 1, ... to the consumer, counted in the state as soon as it has
        each, and moved to the device."""
        epoch, g = self.epoch, self.spec.global_batch_size
        for k, batch in enumerate(batches, start=start):
            if self.epoch != epoch:  # set_epoch() during iteration: this iterator is stale
                return
            self._offset = (k + 1) * g
            if self.device is not None:
                batch = batch.to(self.device, non_blocking=self.pin_memory)
            yield batch

    def _run_batches_from(self, start: int, order: EpochOrder) -> Iterator[Batch]:
        """Batches start, start + 1, ... gathered in runs of `_run_batches` (prefetched)."""
        run = self._run_batches
        firsts = range(start - start % run, len(self), run)
        depth = self.prefetch * max(self.num_workers, 1)
        runs = prefetch_map(lambda first: self._run(first, order), firsts, self.num_workers, depth)
        for first, batches in zip(firsts, runs):
            yield from batches[max(start - first, 0) :]  # a resume inside a run skips some

    def _span_batches(self, start: int, order: EpochOrder) -> Iterator[Batch]:
        """Batches start, start + 1, ... gathered in spans of whole shuffle windows
        (window_spans.py, prefetched): the same batches as `_run_batches_from`."""
        b = self.local_batch_size
        spans = window_spans(order, self.rank, b, start * b, len(self) * b, self._run_batches * b)
        depth = self.prefetch * max(self.num_workers, 1)
        runs = prefetch_map(
            lambda span: self._gather_span(span, order), spans, self.num_workers, depth
        )
        carry = None
        for (q0, q1), arrays, reals in runs:
            done = q1 // b - q0 // b  # batches the span completes
            batches, skip = [], 0
            if q0 % b:  # the batch the previous span ended inside
                first = join_first(carry, arrays, q0 % b, b, whole=done > 0)
                if done:
                    batches, skip = self._gatherer.batches_of(*first, reals[:1], b), 1
            if q1 % b:
                carry = carry_of(arrays, done, b)
            labels, dense, values = arrays
            batches += self._gatherer.batches_of(
                labels[skip * b :], dense[skip * b :], values[skip:], reals[skip:done], b
            )
            yield from (batch.pin_memory() for batch in batches) if self.pin_memory else batches

    def state_dict(self) -> dict[str, Any]:
        """Position (epoch, global sample offset) and what the order depends on."""
        s, mix = self.spec, self.spec.shuffle
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "sample_offset": self._offset,
            "seed": mix.seed,
            "global_batch_size": s.global_batch_size,
            "shuffle": mix.enabled,
            "tail": s.tail,
            "block_rows": mix.block_rows,
            "window_blocks": mix.window_blocks,
            "segment_blocks": mix.segment_blocks,
            "group_segments": mix.group_segments,
            "num_samples": s.num_samples,
            "fingerprint": self.source.fingerprint,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly after the batches `state` had yielded, on the next `iter()`.

        Raises ValueError when the state belongs to another stream (dataset, seed, global
        batch, shuffle or tail differ); the world size may differ.
        """
        mine = self.state_dict()
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"loader state version {state.get('version')!r} is not {STATE_VERSION}"
            )
        for key in (
            "seed",
            "global_batch_size",
            "shuffle",
            "tail",
            "block_rows",
            "window_blocks",
            "segment_blocks",
            "group_segments",
            "num_samples",
            "fingerprint",
        ):
            if state.get(key) != mine[key]:
                raise ValueError(
                    f"loader state has {key}={state.get(key)!r} but this loader has {mine[key]!r}: not the same stream"
                )
        offset, g = int(state["sample_offset"]), self.spec.global_batch_size
        if offset % g or not 0 <= offset <= len(self) * g:
            raise ValueError(
                f"loader state sample_offset={offset} is not a batch boundary in [0, {len(self) * g}]"
            )
        self.epoch, self._offset, self._resume_pending = int(state["epoch"]), offset, True


def build_loader(
    directory: str | Path,
    split: str,
    *,
    global_batch_size: int,
    rank: int,
    world_size: int,
    shuffle: ShuffleSpec = ShuffleSpec(),
    tail: str = "drop",
    epoch: int = 0,
    hashes: list[int] | None = None,
    delivery: Delivery = Delivery(),
    multihot: MultiHotOption | None = None,
) -> BatchLoader | EventLoader:
    """Open `split` of the dataset in `directory` and return this rank's loader (an event-log
    dataset's: the temporal loader, dataloader/event_loader.py).

    Cheap checks run here, before training starts: files exist and have the manifest's
    sizes, the split has rows, and (tail="drop") at least one global batch.

    Args:
        global_batch_size: samples per step over all ranks; must divide by world_size.
        shuffle: on/off, seed and shuffle levels (dataloader/order.py); NO_SHUFFLE: file order.
        tail: "drop" or "pad" the last partial global batch.
        hashes: torchrec npy layout only: per-feature (or one) hash size to fold raw ids into.
        delivery: workers, prefetch depth, pinning, device, gather size, compiled kernels.
        multihot: make multi-hot ids from this one-hot split at batch time
            (dataloader/multihot/multihot_tables.py).
    """
    if world_size <= 0 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    if global_batch_size <= 0 or global_batch_size % world_size:
        raise ValueError(
            f"global_batch_size {global_batch_size} does not divide by world_size {world_size}"
        )
    manifest = None
    # An event-log dataset has an events/ folder beside its manifest (cheaper to see than the
    # manifest of 10,000 parts is to read twice).
    if (Path(directory) / EVENTS_DIR).is_dir() and (Path(directory) / MANIFEST).is_file():
        manifest = Manifest.load(directory)
    if manifest is not None and manifest.kind == "events":
        if multihot is not None or hashes is not None:
            raise DatasetError(
                f"{directory}: an event-log dataset: on-the-fly multi-hot ids and hash sizes are "
                "for row datasets"
            )
        return build_event_loader(
            directory,
            split,
            global_batch_size=global_batch_size,
            rank=rank,
            world_size=world_size,
            shuffle=shuffle.enabled,
            seed=shuffle.seed,
            tail=tail,
            epoch=epoch,
            num_workers=delivery.num_workers,
            device=delivery.device,
            manifest=manifest,
        )
    source = open_source(
        directory, split, hashes=hashes, max_mapped_parts=delivery.max_mapped_parts
    )
    tables = None
    if multihot is not None:
        source, tables = multihot_source(source, multihot)
    spec = OrderSpec(source.part_rows, global_batch_size, tail, shuffle)
    if spec.num_batches == 0:
        raise DatasetError(
            f"{directory}: split {split!r} has {spec.num_samples} rows, fewer than one global batch of "
            f"{global_batch_size}; use a smaller global batch or tail='pad'"
        )
    return BatchLoader(
        source,
        spec,
        rank=rank,
        world_size=world_size,
        epoch=epoch,
        delivery=delivery,
        index_tables=tables,
    )
