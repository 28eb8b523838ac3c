"""`shardrec export`: a run's checkpoint as one unsharded model file, readable without torchrun.

The DCP checkpoint is read in this one process, without a process group: its metadata names
every tensor of the model with its full shape, and each is read whole (DCP gathers it from
the shards every rank wrote), one at a time, straight into the output. So memory holds one
table at a time, and a table larger than the memory available is refused up front with a
message, not half-written.

The file is safetensors (no pickle): a JSON header with each tensor's dtype, shape and byte
range, then the raw bytes. Its `__metadata__["shardrec"]` holds, as JSON, what scoring needs
besides the weights: the model config, the tables and their features, the dense features,
and the dataset's feature transform (hashing or vocabulary, dense transform, text schema,
on-the-fly multi-hot option) from the dataset's manifest (file_header.py makes it).
"""

from __future__ import annotations

import json
import logging
import os
import struct
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorProperties, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

from shardrec.dataloader.format.fingerprints import dataset_fingerprint, older_fingerprints
from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.util.files import WriteError, atomic_open, write_error
from shardrec.embeddings.dims import UNPOOLED
from shardrec.embeddings.tables import table_weight_fqn
from shardrec.sharding.machine.hardware import available_memory_bytes
from shardrec.trainer.inference.eval_request import (
    find_checkpoint,
    run_config,
    stretch_data,
)
from shardrec.trainer.inference.file_header import model_header
from shardrec.trainer.inference.model_file import (
    DIGEST_KEY,
    META_KEY,
    UNSEALED,
    VOCAB_PREFIX,
    SealingWriter,
)
from shardrec.trainer.inference.trained_rows import (
    DRAWN_ON_KEY,
    HEADER_KEY,
    TRAINED_PREFIX,
    bits_shape,
    marked_tables,
    trained_bits,
)
from shardrec.trainer.job.config import JobConfig
from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.checkpoint.dcp_files import read_file, read_metadata, short_file
from shardrec.trainer.rundir.checkpoint.signature import (
    check_signature,
    check_step,
    checkpoint_signature,
)
from shardrec.trainer.rundir.checkpoint.trust import (
    UntrustedCheckpoint,
    refused_with_advice,
    unreadable_checkpoint,
    verify_checkpoint,
)
from shardrec.trainer.rundir.life.initial_weights import InitialWeights, read_initial_weights

logger = logging.getLogger(__name__)

# The checkpoint's DCP keys of the model: part "model", then the TrainModule's "model." wrapper.
CHECKPOINT_PREFIX = "model.model."
_SAFETENSORS_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.uint8: "U8",
    torch.uint32: "U32",  # a vocabulary's values and ids
    torch.uint64: "U64",
    torch.bool: "BOOL",
}
ITEM_MAPS = "events.items."
"""Prefix of an event-log model's item maps in the file (`events.items.artist`, `...album`):
int32 per item, what `predict` reads raw event rows by."""
READ_ANOTHER = "export another checkpoint with --checkpoint STEP"
"""What to do about a checkpoint that cannot be read."""


def _tensor_entries(checkpoint: Path) -> dict[str, TensorStorageMetadata]:
    """The model's tensors in the checkpoint: RecModel state-dict name -> DCP metadata."""
    verify_checkpoint(checkpoint)  # DCP unpickles .metadata: only once its digests vouch for it
    metadata = read_metadata(checkpoint, READ_ANOTHER)
    return {
        key[len(CHECKPOINT_PREFIX) :]: meta
        for key, meta in sorted(metadata.state_dict_metadata.items())
        if key.startswith(CHECKPOINT_PREFIX) and isinstance(meta, TensorStorageMetadata)
    }


def _nbytes(meta: TensorStorageMetadata) -> int:
    return (
        int(torch.Size(meta.size).numel())
        * torch.empty((), dtype=meta.properties.dtype).element_size()
    )


def _read_tensor(checkpoint: Path, name: str) -> torch.Tensor:
    """One tensor, whole, gathered from every rank's shards (no process group needed)."""
    with (
        warnings.catch_warnings()
    ):  # its "assuming ... a single process" warning is exactly the intent
        warnings.filterwarnings(
            "ignore", message="torch.distributed is unavailable or uninitialized"
        )
        try:
            loaded: Any = _load_state_dict_from_keys(
                {CHECKPOINT_PREFIX + name}, checkpoint_id=str(checkpoint)
            )
        except CheckpointException as e:
            # DCP wraps whatever its reads raise, Ctrl-C too: a Ctrl-C stays one, a truncated
            # file is one line.
            cut = short_file(checkpoint, read_metadata(checkpoint, READ_ANOTHER))
            raise unreadable_checkpoint(checkpoint, e, READ_ANOTHER, cut) from None
    while isinstance(
        loaded, dict
    ):  # DCP nests by the first dot: {"model": {"model.<name>": tensor}}
        (loaded,) = loaded.values()
    return loaded.contiguous()


def check_checkpoint(
    checkpoint: Path, run_dir: Path, header: dict[str, Any], data: Path | None = None
) -> None:
    """The check `eval` makes before it reads a checkpoint's weights (CheckpointManager.load):
    ValueError (one line) unless the checkpoint is of the run's model, tables and optimizers (and,
    without `data`, its dataset). A checkpoint of another model, put in the run's checkpoints,
    would otherwise be written under a header that does not describe its tensors."""
    config = run_config(run_dir)
    # As eval: the dataset's fingerprint, unless other data was asked for.
    raw = Manifest.load(config.data.path) if data is None else None
    fingerprint = dataset_fingerprint(raw) if raw is not None else ""
    older = older_fingerprints(raw) if raw is not None else ()
    shapes = [(t["name"], t["rows"], t["dim"]) for t in header["tables"]]
    state = read_file(checkpoint, names.TRAIN_STATE, torch.device("cpu"), READ_ANOTHER)
    check_step(checkpoint, state["progress"]["step"])
    check_signature(
        checkpoint,
        state["signature"],
        checkpoint_signature(config.model, config.optim, shapes, fingerprint, older),
    )


def item_maps(config: JobConfig, data: Path | None = None) -> dict[str, torch.Tensor]:
    """An event-log model's item -> artist and album maps, from its dataset (`data`, else the
    run's data.path; empty for other datasets)."""
    from shardrec.dataloader.events.event_files import EventsInfo, open_items

    directory = Path(data) if data is not None else Path(config.data.path)
    manifest = Manifest.load(directory)
    if manifest.kind != "events":
        return {}
    artist, album = open_items(directory, EventsInfo.from_dict(manifest.events).items)
    return {
        f"{ITEM_MAPS}artist": torch.from_numpy(artist.astype("int32")),
        f"{ITEM_MAPS}album": torch.from_numpy(album.astype("int32")),
    }


def vocab_tensors(header: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The vocabularies the model's training data was mapped by, from its dataset's folder (none
    outside vocabulary mode). They go into the file because predict must map raw values as training
    did: the folder is rebuilt by the next preprocess into that directory (other values, other ids:
    ids past a table's rows, or silently other rows) and gone with the dataset."""
    folder = header["transform"].get("vocab_dir")
    if not folder:
        return {}
    return {
        f"{VOCAB_PREFIX}{name}.{part}": torch.from_numpy(
            np.load(Path(folder) / f"{name}.{part}.npy")
        )
        for name in header["feature_names"]
        for part in ("values", "ids")
    }


ID_MAP_PREFIX = "id_maps."
"""A managed table's id map in the model file: `id_maps.<feature>`, int64 [slots], each slot's raw
id as a bit pattern (MISSING_KEY where free); scoring looks raw ids up in it, read only."""


def id_map_tensors(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The managed tables' id maps of a checkpoint (its train_state.pt's id_maps part), by their
    names in the model file (none for a model without managed tables)."""
    state = read_file(checkpoint, names.TRAIN_STATE, torch.device("cpu"), READ_ANOTHER)
    tables = (state.get("id_maps") or {}).get("tables", {})
    return {ID_MAP_PREFIX + feature: t["slot_key"].contiguous() for feature, t in tables.items()}


class TableMarks:
    """The trained-row bits (trained_rows.py) of the tables export marks, made as their weights
    pass through export: each table is compared with its initial weights while it is in memory."""

    def __init__(self, header: dict[str, Any], seed: int) -> None:
        self.seed = seed
        self.tables = marked_tables(header)
        self.made: dict[str, torch.Tensor] = {}

    def names(self) -> list[str]:
        return [t["name"] for _, t in self.tables]

    def layout(self) -> dict[str, torch.Tensor]:
        """Each table's bits as the file's header lays them out (their values come later)."""
        return {
            TRAINED_PREFIX + t["name"]: torch.empty(bits_shape(t), dtype=torch.uint8)
            for _, t in self.tables
        }

    def read(self, name: str, tensor: torch.Tensor) -> None:
        """Mark the rows of the table whose weight `name` is (none: another tensor)."""
        for index, table in self.tables:
            weight = table_weight_fqn("", table["name"], table.get("pooling") == UNPOOLED)
            if name.endswith("." + weight):
                self.made[table["name"]] = trained_bits(tensor, index, table, self.seed)

    def bits(self) -> list[torch.Tensor]:
        """The bits in the header's order."""
        return [self.made[t["name"]] for _, t in self.tables]


def _safetensors_header(
    entries: dict[str, TensorStorageMetadata],
    header: dict[str, Any],
    extra: dict[str, torch.Tensor] | None = None,
) -> bytes:
    meta = {META_KEY: json.dumps(header, sort_keys=True), DIGEST_KEY: UNSEALED}
    layout: dict[str, Any] = {"__metadata__": meta}
    offset = 0
    shapes = [
        (name, meta.properties.dtype, list(meta.size), _nbytes(meta))
        for name, meta in entries.items()
    ]
    shapes += [
        (name, t.dtype, list(t.shape), t.numel() * t.element_size())
        for name, t in (extra or {}).items()
    ]
    for name, dtype, shape, size in shapes:
        layout[name] = {
            "dtype": _SAFETENSORS_DTYPES[dtype],
            "shape": shape,
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(layout, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes with spaces
    return struct.pack("<Q", len(raw)) + raw


def _write_tensor(f: SealingWriter, tensor: torch.Tensor) -> None:
    # A byte view of the tensor's own storage: no second copy of a large table.
    f.write(memoryview(tensor.view(torch.uint8).numpy()) if tensor.numel() else b"")


def export_model(
    run_dir: Path,
    out: Path,
    step: int | None = None,
    memory_bytes: int | None = None,
    data: Path | None = None,
) -> dict[str, Any]:
    """Write the unsharded model of the run's checkpoint at `step` (None: the newest) to `out`;
    `data`: the run's dataset where it is now (None: the run's data.path, or for a checkpoint of
    an earlier stretch the data that stretch trained on).

    Returns a summary (tensors, bytes, step). ValueError (one line) for a run or checkpoint
    that is not there, or a table larger than `memory_bytes` (default: the memory available).
    """
    found_step, checkpoint = find_checkpoint(run_dir, step)
    if data is None:  # a checkpoint of an earlier stretch: the data it trained on
        data = stretch_data(run_dir, found_step)
    header = model_header(run_dir, found_step, data)
    try:
        entries = _tensor_entries(checkpoint)  # verifies the checkpoint's files first
        check_checkpoint(checkpoint, run_dir, header, data)
    except UntrustedCheckpoint as e:
        raise refused_with_advice(str(e), checkpoint, READ_ANOTHER) from None
    extras = {**item_maps(run_config(run_dir), data), **vocab_tensors(header)}
    for name, tensor in extras.items():
        entries[name] = TensorStorageMetadata(
            TensorProperties(dtype=tensor.dtype), tensor.shape, []
        )
    if not entries:
        raise ValueError(
            f"{checkpoint}: no model tensors under {CHECKPOINT_PREFIX!r} (not a shardrec checkpoint?)"
        )
    limit = memory_bytes if memory_bytes is not None else available_memory_bytes()
    name, largest = max(((n, _nbytes(m)) for n, m in entries.items()), key=lambda item: item[1])
    if limit is not None and largest > limit:
        raise ValueError(
            f"{checkpoint}: tensor {name} takes {largest / 2**30:.2f} GiB, more than the "
            f"{limit / 2**30:.2f} GiB of memory available here: export on a host with more memory"
        )
    maps = id_map_tensors(checkpoint)
    drawn = read_initial_weights(run_dir)
    marked = TableMarks(header, drawn.seed if drawn else run_config(run_dir).train.fixed_seed)
    header = {**header, HEADER_KEY: marked.names()}
    # Another torch release's CPU draws may differ from this one's: left to what the rows say.
    if drawn is not None and (drawn.device != "cpu" or drawn.torch == torch.__version__):
        header[DRAWN_ON_KEY] = drawn.device
    total = sum(_nbytes(m) for m in entries.values())
    layout = _safetensors_header(entries, header, {**maps, **marked.layout()})
    total += sum(t.numel() * t.element_size() for t in maps.values())
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(out) as file:
            f = SealingWriter(file, layout)
            for tensor_name, meta in entries.items():
                tensor = extras.get(tensor_name)
                if tensor is None:
                    tensor = _read_tensor(checkpoint, tensor_name)
                if tuple(tensor.shape) != tuple(meta.size) or tensor.dtype != meta.properties.dtype:
                    raise ValueError(
                        f"{checkpoint}: {tensor_name} read as {tuple(tensor.shape)} {tensor.dtype}, "
                        f"its metadata says {tuple(meta.size)} {meta.properties.dtype}"
                    )
                _write_tensor(f, tensor)
                marked.read(tensor_name, tensor)
                del tensor
            for tensor in [*maps.values(), *marked.bits()]:
                _write_tensor(f, tensor)
            f.seal()
    except OSError as e:  # a full disk or no permission: one line with the bytes it needs
        if isinstance(e, WriteError) or e.filename is None:
            raise write_error(e, out, len(layout) + total) from e
        raise  # another file's (the checkpoint's)
    logger.info(
        "exported %d tensors (%.1f MiB) of step %d to %s",
        len(entries),
        total / 2**20,
        found_step,
        out,
    )
    return {
        "out": str(out),
        "step": found_step,
        "tensors": len(entries),
        "bytes": os.path.getsize(out),
        "tables": len(header["tables"]),
        "untrained_rows": untrained_rows_note(run_dir, drawn),
    }


def untrained_rows_note(run_dir: Path, drawn: InitialWeights | None) -> str | None:
    """Why the file cannot tell which rows never trained (None: it can, or a run from before
    runs recorded the draws: predict tells what their rows say)."""
    if drawn is None or drawn.device == "cpu":
        return None
    return (
        f"can't tell which rows never trained: {run_dir} drew its tables' initial weights on "
        f"{drawn.device} ({names.INITIAL_WEIGHTS}), whose draws export does not repeat on the CPU"
    )
