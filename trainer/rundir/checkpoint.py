"""Sharded checkpoints with torch.distributed.checkpoint (DCP): save, keep the last K, resume.

A checkpoint holds named stateful parts (objects with `state_dict()` / `load_state_dict()`)
and a signature; it does not know what the parts are. `trainer.loop.train_job` names them:

- sharded parts (the model, the embedding optimizer state): DCP files that every rank writes
  its own shards into; loading them under another plan or world size reshards them;
- main parts (dense optimizer + LR schedule, loader position, the managed tables' id maps) and the
  progress: train_state.pt, written by rank 0 together with the layout (the plan the shards were
  written under) and the signature (what the model was, to refuse a foreign checkpoint); every
  rank computes their state (it may be collective), rank 0 writes it;
- per-rank parts (the RNG states): `<name>-<rank>.pt`;
- `digests.json`, written last by rank 0: the sha256 of every other file.

The directory is RUN/checkpoints/step-NNNNNNNN. Every rank writes into `.step-NNNNNNNN.tmp`;
after a barrier rank 0 writes the digests and renames it into place. A kill at any moment
before the rename leaves only a temporary directory, which is ignored and removed later, so
the newest complete checkpoint stays usable.

Trust: every part holds tensors and JSON only (RNG states included) and loads with
`torch.load(weights_only=True)`; DCP's own `.metadata` is a pickle, so no file is read before
the digests (owned by this user, writable by nobody else) vouch for it: see
`trainer.rundir.checkpoint_trust` for the threat model. The checkpoint barriers and DCP's own
collectives run in a gloo group of their own with `checkpoint.timeout_s`, not the training
collectives' timeout; a rank that does not arrive is named.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import shutil
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.stateful import Stateful
from torch.serialization import default_restore_location

from shardrec.dataloader.util.files import atomic_open, fsync_dir
from shardrec.trainer.distributed import faults
from shardrec.trainer.distributed.dist import DistEnv, monitored_barrier
from shardrec.trainer.job.config import ModelConfig, OptimConfig
from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.checkpoint_failure import (
    checkpoint_bytes,
    checkpoint_write_error,
    describe_failure,
)
from shardrec.trainer.rundir.checkpoint_trust import (
    REFUSED,
    UntrustedCheckpoint,
    complete_checkpoints,
    read_digests,
    unreadable_checkpoint,
    verify_files,
    write_digests,
)

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
READ_ANOTHER = (
    "evaluate or export another checkpoint with --checkpoint STEP; to resume training from an "
    "earlier one, move this folder aside"
)
"""What to do about a checkpoint that cannot be read, where eval and export read it."""


def restore_on(device: torch.device) -> Callable[[Any, str], Any]:
    """torch.load's map_location for files saved on any device: a tensor saved on a CUDA device
    comes back on `device` (this rank's own GPU; the CPU on a CPU host), one saved on the CPU
    stays there (RNG states must). Without it every rank would load onto the GPU the file was
    saved from (cuda:0 for rank 0's train_state.pt), and a CPU host could not load it at all."""

    def restore(storage: Any, location: str) -> Any:
        return (
            default_restore_location(storage, str(device))
            if location.startswith("cuda")
            else storage
        )

    return restore


def load_file(path: Path, device: torch.device) -> Any:
    """A checkpoint file of tensors and plain values (weights_only), its CUDA tensors on
    `device`."""
    return torch.load(path, weights_only=True, map_location=restore_on(device))


READ_ERRORS = (OSError, RuntimeError, EOFError, pickle.UnpicklingError)
"""What torch.load raises for a file cut short or corrupt: an OSError (errno 22) or its zip
reader's RuntimeError for a cut zip, EOFError for an empty file, UnpicklingError."""


DCP_READ_ERRORS = (CheckpointException, OSError, EOFError, pickle.UnpicklingError)
"""What reading a checkpoint's DCP files raises for one cut short or corrupt: DCP's load wraps each
rank's failure in a CheckpointException, its metadata reader (read_metadata, which a sharded part
may call itself) raises the unpickler's own."""


METADATA_FALLBACK = (
    "Global metadata is not found. Falling back to rank local metadata.",
    "Rank local metadata is not found.",
)
"""What DCP's load logs, with the traceback, when it cannot read `.metadata` (and, as shardrec
writes none, no per-rank metadata either): the error it then raises says it again."""


class _MetadataFallback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.getMessage() in METADATA_FALLBACK
            and "torch/distributed/checkpoint" in Path(record.pathname).as_posix()
        )


@contextmanager
def quiet_metadata_fallback() -> Iterator[None]:
    """Drop DCP's METADATA_FALLBACK warnings while loading (it logs them to the root logger): a
    checkpoint that cannot be read is one line (unreadable_checkpoint). Other warnings pass."""
    root, quiet = logging.getLogger(), _MetadataFallback()
    root.addFilter(quiet)
    try:
        yield
    finally:
        root.removeFilter(quiet)


def read_file(checkpoint: Path, name: str, device: torch.device, advice: str) -> Any:
    """load_file of the file `name` of the checkpoint at `checkpoint`, whose digests were checked;
    UnreadableCheckpoint (one line ending in `advice`, what to do) where it cannot be read."""
    try:
        return load_file(checkpoint / name, device)
    except READ_ERRORS as e:
        raise unreadable_checkpoint(checkpoint, e, advice, name) from None


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
    """What must match for a checkpoint to load (see describe_mismatch)."""
    layout: str
    """The plan (JSON) the sharded parts are laid out by."""
    per_rank: Mapping[str, Stateful] = field(default_factory=lambda: {"rng": RngState()})
    """File name prefixes -> parts each rank saves into `<name>-<rank>.pt`."""


# Optimizer settings that decide what state a checkpoint holds: a change would drop or misread it.
OPTIMIZER_KEYS = ("sparse", "dense")


def checkpoint_signature(
    model: ModelConfig,
    optim: OptimConfig,
    tables: list[tuple[str, int, int]],
    dataset: str = "",
    older_datasets: tuple[str, ...] = (),
) -> dict[str, Any]:
    """What must match for a checkpoint to load: the model, its tables (name, rows, dim), the
    optimizers' kinds and the dataset's fingerprint (trainer.rundir.life.trained_data; "" skips
    that check), not the plan. `older_datasets`: the dataset's fingerprint as runs recorded it before
    (manifest.older_fingerprints), which their checkpoints hold."""
    signature = {
        "model": asdict(model),
        "optim": {k: getattr(optim, k) for k in OPTIMIZER_KEYS},
        "tables": [
            {"name": name, "rows": int(rows), "dim": int(dim)} for name, rows, dim in tables
        ],
        "dataset": dataset,
    }
    if dataset and older_datasets:  # a click log's signature stays as it was
        signature["older_datasets"] = list(older_datasets)
    return signature


def check_signature(path: Path, saved: dict[str, Any], current: dict[str, Any]) -> None:
    """ValueError (one line) unless the checkpoint at `path`, whose train_state.pt holds the
    signature `saved`, is of the job whose signature is `current`: what every reader of a
    checkpoint's weights checks (a resume, `eval`, `export`)."""
    mismatch = describe_mismatch(saved, current)
    if mismatch:
        raise ValueError(f"{path}: checkpoint of another model or optimizer: {mismatch}")


def describe_mismatch(saved: dict[str, Any], current: dict[str, Any]) -> str:
    """What differs between a checkpoint's signature and the job's ("" when nothing does)."""
    diffs = []
    for section in ("model", "optim"):
        for key, value in saved.get(section, {}).items():
            if current[section].get(key) != value:
                diffs.append(
                    f"{section}.{key}: checkpoint {value!r}, job {current[section].get(key)!r}"
                )
    # A checkpoint from before dataset fingerprints, or a job that gives none, skips this check; a
    # run that goes on loads the last checkpoint of its previous stretch's data.
    if (
        saved.get("dataset")
        and current.get("dataset")
        and saved["dataset"]
        not in (
            current["dataset"],
            current.get("continues_from"),
            *current.get("older_datasets", ()),
        )
    ):
        diffs.append(
            f"dataset: checkpoint trained on fingerprint {saved['dataset'][:12]}, "
            f"job's data is {current['dataset'][:12]}"
        )
    old = {t["name"]: (t["rows"], t["dim"]) for t in saved["tables"]}
    new = {t["name"]: (t["rows"], t["dim"]) for t in current["tables"]}
    if set(old) != set(new):
        diffs.append(
            f"tables: checkpoint has {len(old)} ({', '.join(sorted(set(old) - set(new))[:3]) or '-'} not in the job), "
            f"job has {len(new)} ({', '.join(sorted(set(new) - set(old))[:3]) or '-'} not in the checkpoint)"
        )
    else:
        diffs += [
            f"table {n} [rows, dim]: checkpoint {list(old[n])}, job {list(new[n])}"
            for n in sorted(old)
            if old[n] != new[n]
        ]
    return "; ".join(diffs)


class CheckpointManager:
    """Saves `parts` into `directory` (keeping the newest `keep`) and loads them back."""

    def __init__(
        self,
        directory: Path,
        env: DistEnv,
        *,
        keep: int,
        parts: CheckpointParts,
        timeout_s: float = 1800,
    ) -> None:
        self.directory = Path(directory)
        self.env = env
        self.keep = keep
        self.parts = parts
        self.timeout_s = timeout_s
        self.kept_steps: set[int] = set()
        """Steps whose checkpoints pruning keeps (the ends of a run's stretches: one per day)."""
        # Every rank constructs the manager, so every rank joins this group (a collective call).
        self.group = (
            dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
            if dist.is_initialized()
            else None
        )

    def complete(self) -> list[tuple[int, Path]]:
        """(step, path) of every complete checkpoint, oldest first."""
        return complete_checkpoints(self.directory)

    def _barrier(self, what: str) -> None:
        if self.group is not None:
            monitored_barrier(self.group, self.timeout_s, what, setting="checkpoint.timeout_s")

    def save(self) -> Path:
        """Write a checkpoint of the parts at the current step; returns its directory.

        A write that fails on any rank (a full disk, no permission) fails the save on every rank
        alike, as one WriteError naming the directory and the bytes the checkpoint needs; the
        temporary directory is removed, the newest complete checkpoint kept."""
        parts, step = self.parts, self.parts.progress.step
        final = self.directory / names.checkpoint_name(step)
        tmp = self.directory / f".{final.name}.tmp"
        failed: BaseException | None = None
        if self.env.is_main:
            try:
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
            except OSError as e:
                failed = e
        self._barrier(f"checkpoint of step {step}: start")
        self._agree(failed, step, tmp)
        try:
            # Every rank asks the main parts for their state before any write can fail on one
            # rank alone (a part may combine the ranks' state in a collective: the id maps'
            # statistics); rank 0 writes it.
            main = {name: part.state_dict() for name, part in parts.main.items()}
            # DCP gathers every rank's write results: a failure anywhere raises on every rank.
            dcp.save(
                {name: part.state_dict() for name, part in parts.sharded.items()},
                checkpoint_id=str(tmp),
                process_group=self.group,
            )
            for name, part in parts.per_rank.items():
                _save_file(tmp / f"{name}-{self.env.rank}.pt", part.state_dict())
            if self.env.is_main:
                _save_file(
                    tmp / names.TRAIN_STATE,
                    {
                        "format_version": FORMAT_VERSION,
                        "progress": parts.progress.state_dict(),
                        **main,
                        "plan": parts.layout,
                        "world_size": self.env.world_size,
                        "signature": parts.signature,
                    },
                )
        # torch's writers raise a RuntimeError for a full disk (no errno); DCP raises its
        # CheckpointException, a BaseException, on every rank when any rank's writes failed.
        except (Exception, CheckpointException) as e:
            failed = e
        faults.maybe_kill("kill_in_save", step, self.env.rank)
        self._barrier(f"checkpoint of step {step}: every rank's files written")
        self._agree(failed, step, tmp)
        if self.env.is_main:
            try:
                write_digests(tmp)
                self._put_in_place(tmp, final)
                self._prune()
                logger.info("step %d: checkpoint %s", step, final)
            except OSError as e:
                failed = e
        self._barrier(f"checkpoint of step {step}: in place")
        self._agree(failed, step, tmp)
        return final

    def _agree(self, failed: BaseException | None, step: int, tmp: Path) -> None:
        """Every rank learns whether any rank's writes failed; if one did, the temporary directory
        goes and every rank raises the same line (the first failed rank's)."""
        problem = "" if failed is None else describe_failure(failed)
        problems = [problem]
        if self.group is not None:
            problems = [""] * self.env.world_size
            dist.all_gather_object(problems, problem, group=self.group)
        if not any(problems):
            return
        if self.env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        needed = checkpoint_bytes(self.parts, self.env.is_main, self.group)
        rank = next(r for r, p in enumerate(problems) if p)
        raise checkpoint_write_error(problems[rank], rank, step, self.directory, needed)

    def _put_in_place(self, tmp: Path, final: Path) -> None:
        # A re-save of a step (a re-run) keeps the old copy until the new one is in place.
        old = final.with_name(f".{final.name}.old.tmp")
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        fsync_dir(self.directory)
        shutil.rmtree(old, ignore_errors=True)

    def _prune(self) -> None:
        done = self.complete()
        for step, path in done[: max(0, len(done) - self.keep)]:
            if step not in self.kept_steps:
                shutil.rmtree(path, ignore_errors=True)
        for path in self.directory.glob(".step-*.tmp"):
            shutil.rmtree(path, ignore_errors=True)

    def load_latest(self, skip: tuple[str, ...] = ()) -> int | None:
        """Load the newest complete checkpoint into the parts (but the main parts named in `skip`:
        a run that goes on starts its new data's loader afresh); returns its step, or None if there
        is none."""
        complete = self.complete() if self.env.is_main else []
        found = [str(complete[-1][1]) if complete else None]
        if self.group is not None:
            dist.broadcast_object_list(
                found, src=0, group=self.group
            )  # every rank loads the one rank 0 chose
        if found[0] is None:
            return None
        # A rerun would resume from this one again: the launcher names the one before it.
        self.load(Path(found[0]), skip, advice=REFUSED)
        return self.parts.progress.step

    def verify(self, path: Path) -> None:
        """Check every file of the checkpoint at `path` against its digests, the ranks sharing the
        hashing; UntrustedCheckpoint (on every rank) naming the first bad file."""
        problem = ""
        try:
            problem = verify_files(path, read_digests(path), self.env.rank, self.env.world_size)
        except UntrustedCheckpoint as e:
            problem = str(e)
        problems = [problem]
        if self.group is not None:
            problems = [""] * self.env.world_size
            dist.all_gather_object(problems, problem, group=self.group)
        first = next((p for p in problems if p), "")
        if first:
            raise UntrustedCheckpoint(first)

    def load(self, path: Path, skip: tuple[str, ...] = (), advice: str = READ_ANOTHER) -> None:
        """Load the checkpoint at `path` into the parts (but the main parts named in `skip`);
        ValueError if its files fail their digests or its signature differs, or (ending in
        `advice`, what to do) if a file that matches its digest cannot be read."""
        parts = self.parts
        self.verify(path)  # before anything is read: DCP unpickles .metadata
        train_state = read_file(path, names.TRAIN_STATE, self.env.device, advice)
        check_signature(path, train_state["signature"], parts.signature)
        saved = SavedCheckpoint(
            path, train_state["progress"]["step"], train_state["plan"], self.group
        )
        try:
            with quiet_metadata_fallback():
                targets = {n: part.load_target(saved) for n, part in parts.sharded.items()}
                dcp.load(
                    {name: target for name, target in targets.items() if target},
                    checkpoint_id=str(path),
                    process_group=self.group,
                )
        except DCP_READ_ERRORS as e:
            raise unreadable_checkpoint(path, e, advice) from None
        for part in parts.sharded.values():
            part.finish_load(saved)
        for name, part in parts.main.items():
            if name not in skip:
                part.load_state_dict(train_state[name])
        parts.progress.load_state_dict(train_state["progress"])
        for name, part in parts.per_rank.items():
            # More ranks than saved it: the new ones start from rank 0's state.
            own = f"{name}-{self.env.rank}.pt"
            own = own if (path / own).is_file() else f"{name}-0.pt"
            part.load_state_dict(read_file(path, own, self.env.device, advice))
        if self.env.is_main:
            logger.info(
                "resumed from %s (step %d, saved by %d ranks, now %d)",
                path,
                parts.progress.step,
                train_state["world_size"],
                self.env.world_size,
            )


def _save_file(path: Path, obj: Any) -> None:
    with atomic_open(path) as f:
        torch.save(obj, f)
