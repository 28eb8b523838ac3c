"""Initial embedding weights that do not depend on the plan or the world size.

Weights are drawn in blocks of rows, each block from its own seeded generator, so a rank draws
only the blocks its shards touch and the values do not depend on how tables are cut: two runs
that differ only in their plan start equal.

Each block is drawn on the device of the shard it fills (CUDA's generator on a GPU: no host
thread drawing 40 M x 128 values and copying them block by block). The values depend on the
device kind (CPU and CUDA generators differ), never on the plan or the world size; on the CPU
they are those of the first implementation, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.embeddings.tables import is_unpooled, table_weight_fqn

INIT_BLOCK_ROWS = 8192
_SAME_SIZE_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _block_seed(seed: int, table_index: int, block: int) -> int:
    return (seed * 1_000_003 + table_index * 7_919 + block) % (2**63 - 1)


def _block_values(
    block: int, table_index: int, table: EmbeddingBagConfig, seed: int, device: torch.device
) -> torch.Tensor:
    """The initial weights of one block of rows of the table, every column: its values depend on
    its size, so the whole block is drawn whatever part of it is needed."""
    bound = math.sqrt(1.0 / table.num_embeddings)
    size = min(INIT_BLOCK_ROWS, table.num_embeddings - block * INIT_BLOCK_ROWS)
    gen = torch.Generator(device=device).manual_seed(_block_seed(seed, table_index, block))
    return torch.empty(size, table.embedding_dim, device=device).uniform_(
        -bound, bound, generator=gen
    )


def _fill_rows(
    out: torch.Tensor, row0: int, col0: int, table_index: int, table: EmbeddingBagConfig, seed: int
) -> None:
    """Write rows [row0, row0 + len(out)) x cols [col0, col0 + width) of the table's initial
    weights."""
    rows, cols = out.shape
    first, last = row0 // INIT_BLOCK_ROWS, (row0 + rows - 1) // INIT_BLOCK_ROWS
    for block in range(first, last + 1):
        start = block * INIT_BLOCK_ROWS
        values = _block_values(block, table_index, table, seed, out.device)
        size = len(values)
        lo, hi = max(start, row0), min(start + size, row0 + rows)
        out[lo - row0 : hi - row0].copy_(values[lo - start : hi - start, col0 : col0 + cols])


@torch.no_grad()
def init_embedding_weights(
    model: torch.nn.Module,
    tables: list[EmbeddingBagConfig],
    seed: int,
    *,
    ebc_path: str,
    ec_path: str = "",
) -> None:
    """Give every table the same initial weights whatever the plan: each rank fills its shards.

    Args:
        model: the model (sharded or not) whose EmbeddingBagCollection sits at `ebc_path`.
        tables: its tables, in the order that numbers their random streams.
        seed: the job's seed.
        ebc_path: where the EmbeddingBagCollection sits in `model` ("" for the collection itself).
        ec_path: where a sequence model's EmbeddingCollection (its unpooled tables) sits.
    """
    state = model.state_dict()
    for index, table in enumerate(tables):
        unpooled = is_unpooled(table)
        weight = state[table_weight_fqn(ec_path if unpooled else ebc_path, table.name, unpooled)]
        if isinstance(weight, ShardedTensor):
            for shard in weight.local_shards():
                row0, col0 = shard.metadata.shard_offsets
                _fill_rows(shard.tensor, row0, col0, index, table, seed)
        else:
            _fill_rows(weight, 0, 0, index, table, seed)


@torch.no_grad()
def rows_at_initial_values(
    weight: torch.Tensor, table_index: int, table: EmbeddingBagConfig, seed: int
) -> torch.Tensor:
    """Which rows of a whole (unsharded) table still hold exactly the initial weights that
    init_embedding_weights gave them: a bool per row, drawn again on the CPU a block at a time.

    A row that any optimizer step changed differs from them (a whole row of floats equal to
    its draw by chance does not happen); a table initialised with another generator (CUDA's, or
    another torch release's) has no row equal to them."""
    at_init = np.empty(table.num_embeddings, dtype=bool)
    # Compared as integers of the values' bits in numpy: torch's intra-op threads cost ten times
    # the comparison on blocks this small (a GB of tables took 20 CPU seconds more to export,
    # numpy's one thread 1.5); numpy has no bfloat16, and bits also tell -0.0 from 0.0.
    bits = _SAME_SIZE_INT[weight.element_size()]
    held = weight.detach().view(bits).numpy()
    for block in range(-(-table.num_embeddings // INIT_BLOCK_ROWS)):
        start = block * INIT_BLOCK_ROWS
        values = _block_values(block, table_index, table, seed, torch.device("cpu"))
        # As init wrote them: cast into the table's dtype.
        drawn = values.to(weight.dtype).view(bits).numpy()
        rows = slice(start, start + len(drawn))
        np.all(held[rows] == drawn, axis=1, out=at_init[rows])
    return torch.from_numpy(at_init)
