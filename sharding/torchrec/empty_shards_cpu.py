"""Row-wise shards without rows on CPU: a correction of fbgemm's fused kernel.

Row-wise blocks are ceil(rows / ranks) rows, so trailing ranks may hold none of a table (3 rows
on 4 ranks: 1, 1, 1, 0; 4 rows on 3: 2, 2, 0). A rank whose row-wise (or table-row-wise) tables
all hold no rows there gets a table batch (fbgemm's SplitTableBatchedEmbeddingBagsCodegen) of no
weights, and fbgemm-gpu-cpu 1.8.0 decides between its CPU and CUDA kernels by whether the host
weights hold any element: that rank's first lookup fails with "weights[0] must be a GPU or MTIA
tensor; it is currently on device CPU", and the job dies in a traceback.

No id reaches such a batch (torchrec buckets ids by the block size), so its lookup is every bag
empty: zeros. `install()` wraps the kernel's forward once: a CPU batch of no weights returns those
zeros (a leaf that requires grad, so that this rank joins the output all-to-all's backward as the
others do) and counts the step as fbgemm would (the counter table_batches.py checkpoints); every
other call goes to fbgemm as before (tests/distributed/test_sharding_types.py: one-row tables
row-wise and table-row-wise on 2 ranks equal the unsharded module).
"""

from __future__ import annotations

import torch
from fbgemm_gpu.split_embedding_configs import SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    SplitTableBatchedEmbeddingBagsCodegen,
)

UPSTREAM_FORWARD = SplitTableBatchedEmbeddingBagsCodegen.forward


def _no_weights_on_cpu(tbe: SplitTableBatchedEmbeddingBagsCodegen) -> bool:
    return (
        tbe.use_cpu
        and tbe.weights_host.numel() == 0
        and tbe.weights_dev.numel() == 0
        and tbe.weights_uvm.numel() == 0
    )


def empty_lookup(
    tbe: SplitTableBatchedEmbeddingBagsCodegen, indices: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """What fbgemm returns for a batch of tables without rows: [B, total_D] zeros pooled (offsets:
    B per table, then the end), [ids, D] unpooled; the step counted as fbgemm counts it."""
    if int(tbe.iter_cpu.item()) == 0:  # fbgemm takes a restored count from `iter` the same way
        tbe.iter_cpu.fill_(int(tbe.iter.item()))
    tbe.iter_cpu.add_(1)
    tbe.iter.add_(1)
    dtype = SparseType.from_int(tbe.output_dtype).as_dtype()
    if tbe.pooling_mode == PoolingMode.NONE:
        shape = (indices.numel(), tbe.max_D)
    else:
        tables = tbe.D_offsets.numel() - 1
        shape = ((offsets.numel() - 1) // max(tables, 1), tbe.total_D)
    return torch.zeros(shape, dtype=dtype, device=indices.device, requires_grad=True)


def _forward(
    self: SplitTableBatchedEmbeddingBagsCodegen,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    *args,
    **kwargs,
) -> torch.Tensor:
    variable_batch = (len(args) > 2 and args[2] is not None) or kwargs.get(
        "batch_size_per_feature_per_rank"
    ) is not None
    if variable_batch or not _no_weights_on_cpu(self):
        return UPSTREAM_FORWARD(self, indices, offsets, *args, **kwargs)
    return empty_lookup(self, indices, offsets)


def install() -> None:
    """Route CPU lookups of fused table batches without weights through `empty_lookup`
    (idempotent)."""
    SplitTableBatchedEmbeddingBagsCodegen.forward = _forward  # type: ignore[method-assign]
