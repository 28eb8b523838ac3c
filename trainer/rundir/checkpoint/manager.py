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
- plain values for readers without torch (the managed tables' update schedule, for the checks
  before any rank starts): JSON files written by rank 0 beside train_state.pt;
- `digests.json`, written last by rank 0: the sha256 of every other file.

The directory is RUN/checkpoints/step-NNNNNNNN. Every rank writes into `.step-NNNNNNNN.tmp`;
after a barrier rank 0 writes the digests and renames it into place. A kill at any moment
before the rename leaves only a temporary directory, which is ignored and removed later, so
the newest complete checkpoint stays usable.

Trust: every part holds tensors and JSON only (RNG states included) and loads with
`torch.load(weights_only=True)`; DCP's own `.metadata` is a pickle, so no file is read before
the digests (owned by this user, writable by nobody else) vouch for it: see
`trainer.rundir.checkpoint.trust` for the threat model. The checkpoint barriers and DCP's own
collectives run in a gloo group of their own with `checkpoint.timeout_s`, not the training
collectives' timeout; a rank that does not arrive is named.

What the parts are: `parts`; what must match to load: `signature`; a file read or written by
torch: `dcp_files` (modules of this package).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from shardrec.dataloader.util.files import fsync_dir
from shardrec.trainer.distributed import faults
from shardrec.trainer.distributed.dist import DistEnv, monitored_barrier
from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.checkpoint.dcp_files import (
    DCP_READ_ERRORS,
    read_file,
    read_metadata,
    save_file,
    short_file,
)
from shardrec.trainer.rundir.checkpoint.failure import (
    checkpoint_bytes,
    checkpoint_write_error,
    describe_failure,
    saved_bytes,
)
from shardrec.trainer.rundir.checkpoint.folders import other_step_checkpoints, other_step_message
from shardrec.trainer.rundir.checkpoint.parts import CheckpointParts, SavedCheckpoint
from shardrec.trainer.rundir.checkpoint.readable import READ_ANOTHER
from shardrec.trainer.rundir.checkpoint.signature import check_signature, check_step
from shardrec.trainer.rundir.checkpoint.trust import (
    REFUSED,
    UntrustedCheckpoint,
    complete_checkpoints,
    read_digests,
    refused_with_advice,
    unreadable_checkpoint,
    verify_files,
    write_digests,
)

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1


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
        self._told: set[Path] = set()
        """Folders named for another step that a prune has said it leaves (said once a job)."""
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
                save_file(tmp / f"{name}-{self.env.rank}.pt", part.state_dict())
            if self.env.is_main:
                save_file(
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
                for name, values in parts.json_files.items():
                    (tmp / name).write_text(json.dumps(values()) + "\n")
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
        # The estimate counts the tensors, not DCP's metadata nor the files' framing (a third more
        # for small tables): what the newest save wrote is the surer measure, where there is one.
        done = self.complete()
        needed = max(needed, saved_bytes(done[-1][1])) if done else needed
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
        # A folder named for another step than it holds (copied or moved by hand) is the user's:
        # counted, it would push one of the run's checkpoints out in its place, then go itself.
        misnamed = dict(other_step_checkpoints(self.directory))
        done = [(step, path) for step, path in self.complete() if path not in misnamed]
        for step, path in done[: max(0, len(done) - self.keep)]:
            if step not in self.kept_steps:
                # Renamed out of the checkpoints' names first: a prune cut short (a kill while a
                # large checkpoint's files go) leaves a temporary folder the next prune removes,
                # never a checkpoint that looks complete with files missing.
                doomed = path.with_name(f".{path.name}.pruned.tmp")
                shutil.rmtree(doomed, ignore_errors=True)
                try:
                    os.replace(path, doomed)
                except OSError:
                    doomed = path
                shutil.rmtree(doomed, ignore_errors=True)
        for path in self.directory.glob(".step-*.tmp"):
            shutil.rmtree(path, ignore_errors=True)
        self._say_left(misnamed)

    def _say_left(self, misnamed: dict[Path, int]) -> None:
        """Name each folder of `misnamed` (folder -> the step it holds) that pruning left, once,
        with the checkpoints it kept."""
        kept = [str(step) for step, path in self.complete() if path not in misnamed]
        for path, held in misnamed.items():
            if path not in self._told:
                self._told.add(path)
                logger.warning(
                    "%s; checkpoint.keep (%d) neither counts nor removes it (kept: steps %s)",
                    other_step_message(path, held),
                    self.keep,
                    ", ".join(kept),
                )

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
        saved_by = self.load(Path(found[0]), skip, advice=REFUSED)
        if self.env.is_main:
            logger.info(
                "resumed from %s (step %d, saved by %d rank%s, now %d)",
                found[0],
                self.parts.progress.step,
                saved_by,
                "" if saved_by == 1 else "s",
                self.env.world_size,
            )
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

    def load(self, path: Path, skip: tuple[str, ...] = (), advice: str = READ_ANOTHER) -> int:
        """Load the checkpoint at `path` into the parts (but the main parts named in `skip`);
        returns the world size that saved it. ValueError if its files fail their digests or its
        signature differs, or (ending in `advice`, what to do) if a file that matches its digest
        cannot be read."""
        parts = self.parts
        try:
            self.verify(path)  # before anything is read: DCP unpickles .metadata
            train_state = read_file(path, names.TRAIN_STATE, self.env.device, advice)
            check_step(path, train_state["progress"]["step"])
        except UntrustedCheckpoint as e:
            raise refused_with_advice(str(e), path, advice) from None
        check_signature(path, train_state["signature"], parts.signature)
        metadata = read_metadata(path, advice)  # a cut one is refused naming it, before DCP's load
        saved = SavedCheckpoint(
            path, train_state["progress"]["step"], train_state["plan"], self.group
        )
        try:
            targets = {name: part.load_target(saved) for name, part in parts.sharded.items()}
            dcp.load(
                {name: target for name, target in targets.items() if target},
                checkpoint_id=str(path),
                process_group=self.group,
            )
        except DCP_READ_ERRORS as e:
            raise unreadable_checkpoint(path, e, advice, short_file(path, metadata)) from None
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
        return int(train_state["world_size"])
