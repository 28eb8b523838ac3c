"""A reassigned row starts afresh: new initial weights, zero optimizer state, in whatever layout
the plan gave its table.

Each rank writes its own part through the same views `init_embedding_weights` fills: the local
shards of the model's state dict (a row range, a column range or both), and of the fused
optimizer's state dict, whose tensors are views of fbgemm's own storage. A data-parallel table is
a plain parameter every rank holds whole; its optimizer state is the after-backward optimizer's.

The new weights are a counter-based draw: splitmix64 of (seed, table, row, generation, column)
-> uniform(-b, b) with init's bound b = sqrt(1 / rows), so every rank computes exactly the values
of the columns it holds, whatever the cut and the world size, and a row reassigned twice gets two
different draws (its generation is the step of the update that reassigned it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor

from shardrec.dataloader.util.splitmix import mix64

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_K_TABLE = np.uint64(0xD1B54A32D192ED03)
_K_ROW = np.uint64(0x8CB92BA72F3D8DD7)
_K_GEN = np.uint64(0xABC98388FB8FAC03)


@dataclass(frozen=True)
class RowResets:
    """The rows of one table to start afresh, and the generation of each."""

    fqn: str
    """The table's weight in the model's state dict (tables.table_weight_fqn)."""
    index: int
    """The table's position among the model's tables (numbers its random stream)."""
    num_embeddings: int
    rows: np.ndarray
    """int64, ascending."""
    generations: np.ndarray
    """int64, one per row."""


def reinit_values(
    seed: int, reset: RowResets, col0: int, cols: int, rows: np.ndarray | None = None
) -> torch.Tensor:
    """[len(rows), cols] fresh weights of columns [col0, col0 + cols) of `reset`'s rows (or of a
    subset `rows`, with their generations)."""
    picked = np.isin(reset.rows, rows) if rows is not None else slice(None)
    r = reset.rows[picked].astype(np.uint64)[:, None]
    g = reset.generations[picked].astype(np.uint64)[:, None]
    c = np.arange(col0, col0 + cols, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        z = (
            np.uint64(seed) * _GOLDEN
            + np.uint64(reset.index + 1) * _K_TABLE
            + r * _K_ROW
            + g * _K_GEN
            + c
        )
    u = (mix64(z) >> np.uint64(40)).astype(np.float64) / float(1 << 24)
    bound = math.sqrt(1.0 / reset.num_embeddings)
    return torch.from_numpy(((2.0 * u - 1.0) * bound).astype(np.float32))


@torch.no_grad()
def reset_rows(
    model: torch.nn.Module,
    resets: list[RowResets],
    seed: int,
    *,
    fused_state: Mapping[str, Mapping[str, object]] | None = None,
    replicated_state: Mapping[torch.nn.Parameter, Mapping[str, object]] | None = None,
) -> None:
    """Give every row of `resets` fresh weights and zero optimizer state, on this rank's part.

    Args:
        model: the sharded (or unsharded) model holding the tables.
        resets: per table, the rows and their generations.
        seed: the job's seed.
        fused_state: the fused optimizer's `state_dict()["state"]` (param FQN -> state name ->
            tensor or ShardedTensor, views of the kernels' state).
        replicated_state: the after-backward optimizer's `state` of data-parallel tables (param
            -> state name -> tensor).
    """
    resets = [r for r in resets if len(r.rows)]
    if not resets:
        return
    state = model.state_dict()
    params = dict(model.named_parameters())
    for reset in resets:
        fqn = reset.fqn
        weight = state[fqn]
        _write_weights(weight, reset, seed)
        for value in (fused_state or {}).get(fqn, {}).values():
            _zero_rows(value, reset)
        param = params.get(fqn)
        if param is not None and replicated_state is not None:
            for value in replicated_state.get(param, {}).values():
                _zero_rows(value, reset)


def _write_weights(weight: torch.Tensor, reset: RowResets, seed: int) -> None:
    if isinstance(weight, ShardedTensor):
        for shard in weight.local_shards():
            row0, col0 = shard.metadata.shard_offsets
            height, width = shard.tensor.shape
            mine = reset.rows[(reset.rows >= row0) & (reset.rows < row0 + height)]
            if len(mine):
                values = reinit_values(seed, reset, col0, width, mine)
                shard.tensor[torch.from_numpy(mine - row0)] = values.to(shard.tensor.device)
        return
    values = reinit_values(seed, reset, 0, weight.shape[1])
    weight[torch.from_numpy(reset.rows)] = values.to(weight.device, weight.dtype)


def _zero_rows(value: object, reset: RowResets) -> None:
    """Zero the reset rows of one optimizer state: [rows, dim] like the weights, or row-wise
    [k * rows] (one accumulator per row of each of k column shards, shard j at j * rows)."""
    if isinstance(value, ShardedTensor):
        for shard in value.local_shards():
            _zero_local(shard.tensor, shard.metadata.shard_offsets[0], reset)
    elif isinstance(value, torch.Tensor) and value.dim() >= 1:
        _zero_local(value, 0, reset)


def _zero_local(tensor: torch.Tensor, offset: int, reset: RowResets) -> None:
    rows = reset.num_embeddings
    first = np.arange(offset, offset + tensor.shape[0], dtype=np.int64)
    hit = np.flatnonzero(np.isin(first % rows if tensor.dim() == 1 else first, reset.rows))
    if len(hit):
        tensor[torch.from_numpy(hit)] = 0
