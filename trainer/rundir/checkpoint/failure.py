"""A checkpoint save that failed: how big a checkpoint is, how a rank's failure travels to the
others, and the one line every rank raises (checkpoint.CheckpointManager.save).

A full disk under torch's writers is no OSError: its zip writer says "unexpected pos 704 vs 598"
in a RuntimeError, DCP wraps each rank's failure in a CheckpointException. So a failure is also
judged by the filesystem itself: less free space than the checkpoint needs is a full disk, a
directory this process may not write is a permission error.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from shardrec.dataloader.util.files import WriteError, space_left, write_error
from shardrec.trainer.rundir import names


def checkpoint_bytes(parts: Any, is_main: bool, group: Any) -> int:
    """About what one checkpoint of `parts` (parts.CheckpointParts) takes on disk: every
    rank's shards, and the whole tensors (DCP writes a replicated one once) and train_state.pt on
    rank 0. A collective over `group`: every rank calls it."""
    import torch.distributed as dist

    mine = sum(local_bytes(v, is_main) for p in parts.sharded.values()
               for v in p.state_dict().values())  # fmt: skip
    mine += sum(local_bytes(v, True) for p in parts.per_rank.values()
                for v in leaves(p.state_dict()))  # fmt: skip
    if is_main:
        mine += sum(local_bytes(v, True) for p in parts.main.values()
                    for v in leaves(p.state_dict()))  # fmt: skip
    total = torch.tensor([float(mine)], dtype=torch.float64)
    if group is not None:
        dist.all_reduce(total, group=group)
    return int(total.item())


def saved_bytes(checkpoint: Path) -> int:
    """What a complete checkpoint takes on disk (its files' sizes; 0 where it cannot be read)."""
    total = 0
    for root, _, files in os.walk(checkpoint):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size
            except OSError:
                continue
    return total


def leaves(value: Any) -> list[Any]:
    """The values inside nested dicts and lists (a state dict's tensors)."""
    if isinstance(value, Mapping):
        return [leaf for v in value.values() for leaf in leaves(v)]
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in leaves(v)]
    return [value]


def local_bytes(value: Any, whole_too: bool) -> int:
    """Bytes this rank writes of a state value: its local shards of a sharded tensor (torchrec's
    ShardedTensor, a DTensor); a whole tensor only where `whole_too` (one rank writes it)."""
    if isinstance(value, Mapping):
        return sum(local_bytes(v, whole_too) for v in value.values())
    local_shards = getattr(value, "local_shards", None)
    if callable(local_shards):
        return sum(s.tensor.numel() * s.tensor.element_size() for s in local_shards())
    to_local = getattr(value, "to_local", None)
    if callable(to_local):
        local = to_local()
        return local.numel() * local.element_size()
    if isinstance(value, torch.Tensor) and whole_too:
        return value.numel() * value.element_size()
    return 0


def _errno_of(error: BaseException) -> int | None:
    """The first errno in an exception, its causes and, for DCP's CheckpointException, each rank's
    failure."""
    seen: list[BaseException] = []
    todo = [error]
    while todo:
        e = todo.pop(0)
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        if isinstance(e, OSError) and e.errno is not None:
            return e.errno
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        todo += [e.__cause__, e.__context__]
    return None


def describe_failure(error: BaseException) -> str:
    """How a rank's checkpoint write failed, for the others: `errno:message` (errno 0: none)."""
    said = str(error).strip()
    # An exception without a message (a MemoryError) is named by its type and what it stopped.
    first = f": {said.splitlines()[0][:300]}" if said else " (no message) while writing its files"
    return f"{_errno_of(error) or 0}:{type(error).__name__}{first}"


def checkpoint_write_error(
    problem: str, rank: int, step: int, directory: Path, needed: int
) -> OSError:
    """The one line of a failed checkpoint write: where, what it needed, what to do. A disk that
    has less free space than the checkpoint needs is a full disk whatever torch's writer said
    (its zip writer reports one as "unexpected pos ... vs ...", with no errno)."""
    code, _, said = problem.partition(":")
    number = int(code) if code.isdigit() else 0
    free = space_left(directory)
    if number == 0 and free is not None and free < needed:
        number = errno.ENOSPC
    if number == 0 and not os.access(directory, os.W_OK):
        number = errno.EACCES
    where = directory / f".{names.checkpoint_name(step)}.tmp"
    cause = OSError(number, said, str(where))
    keep = (
        "free space there: checkpoint.keep checkpoints of this size are kept, one more while saving"
    )
    error = write_error(cause, where, needed, keep)
    if isinstance(error, WriteError):
        return WriteError(
            error.errno, f"the checkpoint of step {step}: {error.strerror}", error.filename
        )
    return WriteError(
        errno.EIO, f"the checkpoint of step {step} failed on rank {rank}: {said}", str(where)
    )
