"""Whether a checkpoint whose files match their digests can be read, told torch-free before any
rank starts: its torch files (train_state.pt, the per-rank files) and DCP's .metadata unpickle,
and each DCP shard is as long as that metadata says. A file cut short or corrupt before its
digests were written matches them (it was saved that way): without this, `shardrec train` and
`shardrec eval` found it out only once torchrun had started their ranks and torchrec had loaded
(tens of seconds), to refuse it in the line the ranks still give (dcp_files) where a plain
torchrun starts them. Read only once the digests vouch for the files; no class a pickle names is
imported or run (held_step)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.checkpoint.held_step import pickled_containers, torch_file_containers
from shardrec.trainer.rundir.checkpoint.trust import unreadable_checkpoint, unreadable_file

READ_ANOTHER = (
    "evaluate or export another checkpoint with --checkpoint STEP; to resume training from an "
    "earlier one, move this folder aside"
)
"""What to do about a checkpoint that cannot be read, where eval and export read it."""


def unreadable_problem(checkpoint: Path, advice: str) -> str:
    """The one line refusing the checkpoint at `checkpoint` (trust.unreadable_file's, ending in
    `advice`, what to do) where one of its files cannot be read; "" where each can."""
    torch_files = sorted(checkpoint.glob("*.pt"), key=lambda p: p.name != names.TRAIN_STATE)
    for path in torch_files:
        try:
            torch_file_containers(path)
        # A damaged file fails in any of zipfile's or pickle's ways.
        except Exception as e:
            return str(unreadable_checkpoint(checkpoint, e, advice, path.name))
    if not (checkpoint / names.DCP_METADATA).is_file():
        return ""  # no DCP files to check (the digests say which files a checkpoint has)
    try:
        metadata = pickled_containers((checkpoint / names.DCP_METADATA).read_bytes())
    except Exception as e:
        return str(unreadable_checkpoint(checkpoint, e, advice, names.DCP_METADATA))
    short = _short_shard(checkpoint, metadata)
    if short:
        return str(unreadable_file(checkpoint, short, advice))
    return ""


def _short_shard(checkpoint: Path, metadata: Any) -> str:
    """The first shard file shorter than DCP's metadata (as pickled_containers read it) says, as
    'NAME: SIZE bytes, .metadata says END' ("": none is). Metadata of a shape this does not know
    says none: the ranks read it with torch."""
    storage = getattr(metadata, "state", None)
    storage = storage.get("storage_data") if isinstance(storage, Mapping) else None
    ends: dict[str, int] = {}
    for info in storage.values() if isinstance(storage, Mapping) else ():
        fields = getattr(info, "state", None)
        if not isinstance(fields, Mapping):
            continue
        name, offset, length = (fields.get(k) for k in ("relative_path", "offset", "length"))
        if isinstance(name, str) and isinstance(offset, int) and isinstance(length, int):
            ends[name] = max(ends.get(name, 0), offset + length)
    for name, end in sorted(ends.items()):
        path = checkpoint / name
        size = path.stat().st_size if path.is_file() else 0
        if size < end:
            return f"{name}: {size:,} bytes, {names.DCP_METADATA} says {end:,}"
    return ""
