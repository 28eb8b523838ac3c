"""Batches of an event-log split for one rank: `build_event_loader(...)` -> `EventLoader`, the
temporal loader (the row loader's contract, loader.py, over windows of wall-clock time).

- Global batch k is a pure function of (dataset, seed, epoch, global batch size):
  dataloader/events/temporal_order.py. Rank r of W gets rows [r B, (r + 1) B) of it, so
  `shardrec data digest` gives the same hashes at any world size.
- Each anchor's history is gathered from its user's earlier events when its batch is made
  (dataloader/events/event_batches.py): the samples are never materialised.
- `state_dict()` / `load_state_dict()`: the epoch and the global samples yielded; a resume in the
  middle of a window continues with the next batch of the same order, bit for bit, at any world
  size with the same global batch.
- Evaluation reads a split (the held-out last window: val) in order with tail "pad".
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torchrec.datasets.utils import Batch

from shardrec.dataloader.events.event_batches import EventBatcher, EventSource
from shardrec.dataloader.events.temporal_order import TemporalOrder, TemporalSpec
from shardrec.dataloader.format.manifest import DatasetError, Manifest
from shardrec.dataloader.prefetch import prefetch_map

logger = logging.getLogger(__name__)

STATE_VERSION = 1
STATE_KIND = "events"


class EventLoader:
    """This rank's slice of each global batch of one event-log split, one epoch per `iter()`."""

    def __init__(
        self,
        source: EventSource,
        spec: TemporalSpec,
        *,
        rank: int,
        world_size: int,
        epoch: int = 0,
        num_workers: int = 0,
        device: torch.device | str | None = None,
    ) -> None:
        self.source, self.spec = source, spec
        self.rank, self.world_size = rank, world_size
        self.local_batch_size = spec.global_batch_size // world_size
        self.num_workers = num_workers
        self.device = torch.device(device) if device is not None else None
        self.num_samples: int = spec.num_samples
        """Real anchors of the split (what an epoch covers before the tail rule)."""
        self._batcher = EventBatcher.of(source)
        self._order: TemporalOrder | None = None
        self.epoch = epoch
        self._offset = 0
        self._resume_pending = False

    @property
    def feature_names(self) -> list[str]:
        return self.source.feature_names

    def __len__(self) -> int:
        return self.spec.num_batches

    def set_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"epoch must not be negative, got {epoch}")
        if epoch != self.epoch:
            self.epoch, self._offset, self._resume_pending = epoch, 0, False

    def _epoch_order(self) -> TemporalOrder:
        if self._order is None or self._order.epoch != self.epoch:
            self._order = TemporalOrder(self.spec, self.epoch)
        return self._order

    def window_of(self, k: int) -> int:
        """The window (counted from the dataset's first) of global batch k."""
        w = self._epoch_order().window_of(k)
        return self.source.info.window_ids[self.source.split][w]

    def batch(self, k: int, order: TemporalOrder | None = None) -> Batch:
        """This rank's slice of global batch k of the current epoch."""
        rows, real = (order or self._epoch_order()).batch(k)
        b, r = self.local_batch_size, self.rank
        mine = rows[r * b : (r + 1) * b]
        anchors = tuple(column[mine] for column in self.source.timeline)
        return self._batcher.make(anchors, min(max(real - r * b, 0), b))

    def __iter__(self) -> Iterator[Batch]:
        if not self._resume_pending:
            self._offset = 0
        self._resume_pending = False
        start = self._offset // self.spec.global_batch_size
        order = TemporalOrder(self.spec, self.epoch)  # the workers' own, untouched by set_epoch
        return self._iterate(start, order)

    def _iterate(self, start: int, order: TemporalOrder) -> Iterator[Batch]:
        epoch = self.epoch
        ks = range(start, len(self))
        batches = prefetch_map(
            lambda k: self.batch(k, order), ks, self.num_workers, 2 * max(self.num_workers, 1)
        )
        for k, batch in zip(ks, batches):
            if self.epoch != epoch:
                return
            self._offset = (k + 1) * self.spec.global_batch_size
            if self.device is not None:
                batch = batch.to(self.device)
            yield batch

    def state_dict(self) -> dict[str, Any]:
        s = self.spec
        return {
            "version": STATE_VERSION,
            "kind": STATE_KIND,
            "epoch": self.epoch,
            "sample_offset": self._offset,
            "seed": s.seed,
            "global_batch_size": s.global_batch_size,
            "shuffle": s.shuffle,
            "tail": s.tail,
            "num_samples": s.num_samples,
            "fingerprint": self.source.fingerprint,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue right after the batches `state` had yielded, on the next `iter()`; ValueError
        for the state of another stream (the world size may differ)."""
        mine = self.state_dict()
        for key in (
            "version",
            "kind",
            "seed",
            "global_batch_size",
            "shuffle",
            "tail",
            "num_samples",
            "fingerprint",
        ):
            if state.get(key) != mine[key]:
                raise ValueError(
                    f"loader state has {key}={state.get(key)!r} but this loader has {mine[key]!r}: "
                    "not the same stream"
                )
        offset, g = int(state["sample_offset"]), self.spec.global_batch_size
        if offset % g or not 0 <= offset <= len(self) * g:
            raise ValueError(
                f"loader state sample_offset={offset} is not a batch boundary in [0, {len(self) * g}]"
            )
        self.epoch, self._offset, self._resume_pending = int(state["epoch"]), offset, True


def is_event_dataset(directory: str | Path) -> bool:
    return Manifest.load(directory).kind == "events"


def build_event_loader(
    directory: str | Path,
    split: str,
    *,
    global_batch_size: int,
    rank: int,
    world_size: int,
    shuffle: bool = False,
    seed: int = 0,
    tail: str = "drop",
    epoch: int = 0,
    num_workers: int = 0,
    device: torch.device | str | None = None,
    manifest: Manifest | None = None,
) -> EventLoader:
    """Open `split` of an event-log dataset and return this rank's loader; DatasetError for a
    split with no full global batch under tail "drop"."""
    if world_size <= 0 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
    if global_batch_size <= 0 or global_batch_size % world_size:
        raise ValueError(
            f"global_batch_size {global_batch_size} does not divide by world_size {world_size}"
        )
    source = EventSource(directory, split, manifest)
    spec = TemporalSpec(source.window_offsets, global_batch_size, tail, shuffle, seed)
    if spec.num_batches == 0:
        raise DatasetError(
            f"{directory}: split {split!r} has no window with a global batch of {global_batch_size} "
            f"anchors ({spec.num_samples} anchors in {len(spec.window_sizes)} windows); use a "
            "smaller global batch or tail='pad'"
        )
    return EventLoader(
        source,
        spec,
        rank=rank,
        world_size=world_size,
        epoch=epoch,
        num_workers=num_workers,
        device=device,
    )
