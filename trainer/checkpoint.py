"""Sharded checkpoints with torch.distributed.checkpoint (DCP): save, keep the last K, resume.

A checkpoint is a directory RUN/checkpoints/step-NNNNNNNN holding

- the DCP files of the model (every shard written by its rank) and of the fused embedding
  optimizer state: loading them under another plan or world size reshards them;
- train_state.pt (rank 0): step, epoch, dense optimizer + LR schedule, data-parallel table
  optimizer, loader position, the plan and what the model was (to refuse a foreign checkpoint);
- rng-<rank>.pt: each rank's RNG states.

Every rank writes into `.step-NNNNNNNN.tmp`; after a barrier rank 0 renames it into place.
A kill at any moment before the rename leaves only a temporary directory, which is ignored
and removed later, so the newest complete checkpoint stays usable.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from shardrec.dataloader.files import atomic_open, fsync_dir
from shardrec.trainer import faults
from shardrec.trainer.dist import DistEnv
from shardrec.trainer.optim_state import adapt_fused_state

if TYPE_CHECKING:
    from shardrec.trainer.run import Job

logger = logging.getLogger(__name__)

CHECKPOINT_RE = re.compile(r"^step-(\d{8})$")
TRAIN_STATE = "train_state.pt"
FORMAT_VERSION = 1


@dataclass
class TrainProgress:
    step: int = 0
    """Optimizer steps taken."""
    epoch: int = 0
    """The epoch the next step belongs to."""


# Optimizer settings that decide what state a checkpoint holds: a change would drop or misread it.
OPTIMIZER_KEYS = ("sparse", "dense")


def model_signature(job: "Job") -> dict[str, Any]:
    """What must match for a checkpoint to load: the model, its tables and the optimizers' kinds, not the plan."""
    return {
        "model": asdict(job.config.model),
        "optim": {k: getattr(job.config.optim, k) for k in OPTIMIZER_KEYS},
        "tables": [{"name": t["name"], "rows": t["rows"], "dim": t["dim"]} for t in job.plan.fingerprint["tables"]],
    }


def describe_mismatch(saved: dict[str, Any], current: dict[str, Any]) -> str:
    """What differs between a checkpoint's signature and the job's ("" when nothing does)."""
    diffs = []
    for section in ("model", "optim"):
        for key, value in saved.get(section, {}).items():
            if current[section].get(key) != value:
                diffs.append(f"{section}.{key}: checkpoint {value!r}, job {current[section].get(key)!r}")
    old = {t["name"]: (t["rows"], t["dim"]) for t in saved["tables"]}
    new = {t["name"]: (t["rows"], t["dim"]) for t in current["tables"]}
    if set(old) != set(new):
        diffs.append(f"tables: checkpoint has {len(old)} ({', '.join(sorted(set(old) - set(new))[:3]) or '-'} not in the job), "
                     f"job has {len(new)} ({', '.join(sorted(set(new) - set(old))[:3]) or '-'} not in the checkpoint)")
    else:
        diffs += [f"table {n} [rows, dim]: checkpoint {list(old[n])}, job {list(new[n])}" for n in sorted(old) if old[n] != new[n]]
    return "; ".join(diffs)


def complete_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint in `directory`, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = CHECKPOINT_RE.match(path.name)
        if match and (path / TRAIN_STATE).is_file() and (path / ".metadata").is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


class CheckpointManager:
    def __init__(self, directory: Path, env: DistEnv, keep: int) -> None:
        self.directory = Path(directory)
        self.env = env
        self.keep = keep

    def complete(self) -> list[tuple[int, Path]]:
        """(step, path) of every complete checkpoint, oldest first."""
        return complete_checkpoints(self.directory)

    def _barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    def save(self, job: "Job") -> Path:
        step = job.progress.step
        final = self.directory / f"step-{step:08d}"
        tmp = self.directory / f".step-{step:08d}.tmp"
        if self.env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        self._barrier()
        state = {"model": job.model.state_dict(), "fused_optim": _sparse_optim_state(job)}
        dcp.save(state, checkpoint_id=str(tmp))
        _save_file(tmp / f"rng-{self.env.rank}.pt", _rng_state())
        if self.env.is_main:
            _save_file(tmp / TRAIN_STATE, {
                "format_version": FORMAT_VERSION,
                "progress": asdict(job.progress),
                "optimizer": job.runner.optimizer.state_dict(),
                "loader": job.train_loader.state_dict(),
                "plan": job.plan.to_json(),
                "world_size": self.env.world_size,
                "signature": model_signature(job),
            })
        faults.maybe_kill("kill_in_save", step, self.env.rank)
        self._barrier()
        if self.env.is_main:
            if final.exists():  # a re-run of the same step: replace it
                shutil.rmtree(final)
            os.replace(tmp, final)
            fsync_dir(self.directory)
            self._prune()
            logger.info("step %d: checkpoint %s", step, final)
        self._barrier()
        return final

    def _prune(self) -> None:
        done = self.complete()
        for _, path in done[: max(0, len(done) - self.keep)]:
            shutil.rmtree(path, ignore_errors=True)
        for path in self.directory.glob(".step-*.tmp"):
            shutil.rmtree(path, ignore_errors=True)

    def load_latest(self, job: "Job") -> int | None:
        """Load the newest complete checkpoint into `job`; returns its step, or None if there is none."""
        complete = self.complete() if self.env.is_main else []
        found = [complete[-1][1] if complete else None]
        if dist.is_initialized():
            dist.broadcast_object_list(found, src=0)  # every rank loads the one rank 0 chose
        if found[0] is None:
            return None
        self.load(Path(found[0]), job)
        return job.progress.step

    def load(self, path: Path, job: "Job") -> None:
        train_state = torch.load(path / TRAIN_STATE, weights_only=False)
        current = model_signature(job)
        mismatch = describe_mismatch(train_state["signature"], current)
        if mismatch:
            raise ValueError(f"{path}: checkpoint of another model or optimizer: {mismatch}")
        model_state = job.model.state_dict()
        sparse_state = _sparse_optim_state(job)
        converted = adapt_fused_state(path, sparse_state, train_state["plan"], job.plan)
        state = {"model": model_state}
        if sparse_state["state"]:
            state["fused_optim"] = sparse_state
        dcp.load(state, checkpoint_id=str(path))
        state["fused_optim"] = sparse_state
        for key, entries in converted.items():
            sparse_state["state"].setdefault(key, {}).update(entries)
        job.model.load_state_dict(state["model"])
        optimizer = job.runner.optimizer
        replicated = optimizer.replicated_state()
        for fqn, entries in replicated.items():  # loaded in place; copy in case DCP replaced them
            for name, tensor in entries.items():
                tensor.copy_(state["fused_optim"]["state"][fqn][name])
        fused = {k: v for k, v in state["fused_optim"]["state"].items() if k not in replicated}
        job.model.fused_optimizer.load_state_dict({**state["fused_optim"], "state": fused})
        optimizer.load_state_dict(train_state["optimizer"])
        optimizer.set_replicated_steps(train_state["progress"]["step"])
        job.train_loader.load_state_dict(train_state["loader"])
        job.progress.step = train_state["progress"]["step"]
        job.progress.epoch = train_state["progress"]["epoch"]
        rng = path / f"rng-{self.env.rank}.pt"
        _set_rng_state(torch.load(rng if rng.is_file() else path / "rng-0.pt", weights_only=False))
        if self.env.is_main:
            logger.info("resumed from %s (step %d, saved by %d ranks, now %d)", path, job.progress.step,
                        train_state["world_size"], self.env.world_size)


def _sparse_optim_state(job: "Job") -> dict[str, Any]:
    """The fused optimizers' state plus the data-parallel tables' row-wise Adagrad state, all
    keyed by parameter FQN and fbgemm's state names, so either reshards into the other."""
    state = job.model.fused_optimizer.state_dict()
    state = {**state, "state": {**state["state"], **job.runner.optimizer.replicated_state()}}
    return state


def _rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def _save_file(path: Path, obj: Any) -> None:
    with atomic_open(path) as f:
        torch.save(obj, f)
