"""A checkpoint's files as torch reads and writes them: tensors onto this rank's device, and a
file (or DCP's metadata) that cannot be read as the one unreadable-checkpoint line
(trust.unreadable_checkpoint), not torch's traceback."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata
from torch.serialization import default_restore_location

from shardrec.dataloader.util.files import atomic_open
from shardrec.trainer.rundir.checkpoint.trust import unreadable_checkpoint
from shardrec.trainer.rundir.names import DCP_METADATA


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


def read_metadata(checkpoint: Path, advice: str) -> Metadata:
    """DCP's metadata of the checkpoint at `checkpoint`, whose digests were checked;
    UnreadableCheckpoint (one line naming the file, ending in `advice`, what to do) where it
    cannot be read. Read before DCP's load, which reads it too: a cut one would fail inside the
    load as an AssertionError naming a rank's metadata file shardrec never writes."""
    try:
        return FileSystemReader(str(checkpoint)).read_metadata()
    except DCP_READ_ERRORS as e:
        raise unreadable_checkpoint(checkpoint, e, advice, DCP_METADATA) from None


def short_file(checkpoint: Path, metadata: Metadata) -> str:
    """The first of the checkpoint's shard files (`__0_0.distcp`, ...) that is shorter than its
    metadata says, or missing ("": none is): what a failed DCP load names, since DCP's own error
    (EOFError, or the zip reader's) does not say which file it was reading."""
    ends: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = info.offset + info.length
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), end)
    for name, end in sorted(ends.items()):
        try:
            if (checkpoint / name).stat().st_size < end:
                return name
        except OSError:
            return name
    return ""


def read_file(checkpoint: Path, name: str, device: torch.device, advice: str) -> Any:
    """load_file of the file `name` of the checkpoint at `checkpoint`, whose digests were checked;
    UnreadableCheckpoint (one line ending in `advice`, what to do) where it cannot be read."""
    try:
        return load_file(checkpoint / name, device)
    except READ_ERRORS as e:
        raise unreadable_checkpoint(checkpoint, e, advice, name) from None


def save_file(path: Path, obj: Any) -> None:
    """Write `obj` to `path` with torch.save, whole or not at all."""
    with atomic_open(path) as f:
        torch.save(obj, f)
