"""What a checkpoint holds: the named stateful parts a job saves and restores (sharded, main and
per-rank), the training progress that names a checkpoint, and what a sharded part is told of the
checkpoint it is loaded from (see trainer.rundir.checkpoint.manager)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful


@dataclass
class TrainProgress:
    step: int = 0
    """Optimizer steps taken."""
    epoch: int = 0
    """The epoch the next step belongs to (of the current stretch's data)."""
    stretch: int = 0
    """The stretch of a run that goes on (`--continue-on`): 0, then one more per new dataset."""
    stretch_start: int = 0
    """The step the current stretch started at: its epochs count from there."""
    unlogged_loss: float = 0.0
    """The training loss summed over the steps since the last log line (train.log_interval):
    a checkpoint between two log lines keeps it, so that a resumed run logs the next line's loss
    as the uninterrupted run does, bit for bit."""
    unlogged_steps: int = 0
    """The steps `unlogged_loss` sums."""

    def state_dict(self) -> dict[str, int | float]:
        # The first stretch (every run that never went on) saves what checkpoints always held,
        # and the loss since the last log line only where there is one.
        state: dict[str, int | float] = (
            {k: v for k, v in asdict(self).items() if not k.startswith("unlogged")}
            if self.stretch
            else {"step": self.step, "epoch": self.epoch}
        )
        if self.unlogged_steps:
            state.update(unlogged_loss=self.unlogged_loss, unlogged_steps=self.unlogged_steps)
        return state

    def load_state_dict(self, state: dict[str, int | float]) -> None:
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        # Checkpoints of a first stretch, or from before stretches, hold no stretch.
        self.stretch = int(state.get("stretch", 0))
        self.stretch_start = int(state.get("stretch_start", 0))
        self.unlogged_loss = float(state.get("unlogged_loss", 0.0))
        self.unlogged_steps = int(state.get("unlogged_steps", 0))


@dataclass(frozen=True)
class SavedCheckpoint:
    """What a sharded part may need to know of the checkpoint it is loaded from."""

    path: Path
    step: int
    layout: str
    """The plan (JSON) the shards were written under."""
    group: dist.ProcessGroup | None = None
    """The checkpoint's gloo group (checkpoint.timeout_s): a part that reads more of the
    checkpoint itself loads over it, on every rank."""


class ShardedPart(Protocol):
    """A part every rank saves its shards of with DCP, and loads resharded to the current layout."""

    def state_dict(self) -> dict[str, Any]:
        """The state to save."""
        ...

    def load_target(self, saved: SavedCheckpoint) -> dict[str, Any]:
        """The state DCP fills in place (empty: nothing to read); may read parts of `saved`
        itself."""
        ...

    def finish_load(self, saved: SavedCheckpoint) -> None:
        """Take in the target DCP filled."""
        ...


class ModuleState:
    """A module (sharded by DistributedModelParallel) as a sharded part."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self._target: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        return self.module.state_dict()

    def load_target(self, saved: SavedCheckpoint) -> dict[str, Any]:
        self._target = self.module.state_dict()
        return self._target

    def finish_load(self, saved: SavedCheckpoint) -> None:
        self.module.load_state_dict(self._target)


class RngState:
    """This process's torch, numpy and Python RNG states (a per-rank part), as tensors and plain
    values only, so that they load with weights_only=True."""

    def state_dict(self) -> dict[str, Any]:
        kind, keys, pos, has_gauss, gauss = np.random.get_state()
        version, words, py_gauss = random.getstate()
        return {
            "torch": torch.get_rng_state(),
            "numpy": {
                "kind": str(kind),
                "keys": torch.from_numpy(keys.astype(np.int64)),
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(gauss),
            },
            # Mersenne Twister words are < 2^32: exact in int64.
            "python": {
                "version": int(version),
                "words": torch.tensor(words, dtype=torch.int64),
                "gauss": py_gauss,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        n = state["numpy"]
        np.random.set_state(
            (
                n["kind"],
                n["keys"].numpy().astype(np.uint32),
                n["pos"],
                n["has_gauss"],
                n["cached_gaussian"],
            )
        )
        py = state["python"]
        random.setstate((py["version"], tuple(int(w) for w in py["words"].tolist()), py["gauss"]))


@dataclass(frozen=True)
class CheckpointParts:
    """Everything a checkpoint saves and restores, by name (the names are the on-disk keys)."""

    progress: TrainProgress
    """The step (it names the checkpoint) and epoch; train_state.pt["progress"]."""
    sharded: Mapping[str, ShardedPart]
    """DCP state keys -> parts, loaded in this order."""
    main: Mapping[str, Stateful]
    """train_state.pt keys -> parts saved whole by rank 0, loaded in this order."""
    signature: dict[str, Any]
    """What must match for a checkpoint to load (signature.describe_mismatch)."""
    layout: str
    """The plan (JSON) the sharded parts are laid out by."""
    per_rank: Mapping[str, Stateful] = field(default_factory=lambda: {"rng": RngState()})
    """File name prefixes -> parts each rank saves into `<name>-<rank>.pt`."""
    json_files: Mapping[str, Callable[[], dict[str, Any]]] = field(default_factory=dict)
    """File names -> the JSON values rank 0 writes beside train_state.pt: what the checks before
    any rank starts read of a checkpoint without torch."""
