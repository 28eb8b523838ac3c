"""Data-parallel unpooled tables on CPU: a correction of fbgemm's dense kernel.

A data-parallel table of an EmbeddingCollection runs on fbgemm's
`DenseTableBatchedEmbeddingBagsCodegen` with `PoolingMode.NONE`. fbgemm-gpu-cpu 1.8.0's CPU
kernel ignores that mode and pools every bag, so torchrec's split of the output by lengths fails
(`split_with_sizes expects split_sizes to sum exactly to ...`), on one rank or many. The fused
(sharded) kernel is right. `install()` wraps the dense kernel's forward once: for an unpooled
table on CPU it reads each id's row from the flat weight itself (an index_select, whose backward
writes the dense gradient DDP averages); every other call, CUDA's included, goes to fbgemm as
before. `UPSTREAM_FORWARD` keeps fbgemm's own, for the test that proves the bug is still there
(tests/unit/test_sequence_tables.py): when it fails, fbgemm is fixed and this module can go.
"""

from __future__ import annotations

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    DenseTableBatchedEmbeddingBagsCodegen,
)

UPSTREAM_FORWARD = DenseTableBatchedEmbeddingBagsCodegen.forward


def unpooled_rows(
    module: DenseTableBatchedEmbeddingBagsCodegen, indices: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """[ids, D] rows of the ids, feature by feature (offsets: B per feature, then the end): feature
    f's ids index its table, which starts at element `weights_offsets[f]` of the flat weight (the
    offsets are already per feature, shared tables included). An id outside its table raises, as
    fbgemm's FATAL bounds check does, instead of reading the next table's rows."""
    widths = (module.D_offsets[1:] - module.D_offsets[:-1]).unique()
    if widths.numel() != 1:
        raise ValueError(f"unpooled lookups need one width, this kernel has {widths.tolist()}")
    dim = int(widths[0])
    starts_of_table = {
        int(start): rows
        for start, (rows, _) in zip(module.weights_physical_offsets, module.embedding_specs)
    }
    table_rows = torch.tensor(
        [starts_of_table[int(start)] for start in module.weights_offsets.tolist()]
    )
    features = module.weights_offsets.numel()
    batch = (offsets.numel() - 1) // features
    if batch == 0 or indices.numel() == 0:
        return module.weights.view(-1, dim)[:0] * 1.0
    ends = offsets[batch::batch].long()
    starts = offsets[:-1:batch].long()
    feature_of = torch.repeat_interleave(torch.arange(features), ends - starts)
    ids = indices.long()
    bad = (ids < 0) | (ids >= table_rows[feature_of])
    if bool(bad.any()):
        at = int(bad.nonzero()[0, 0])
        feature = int(feature_of[at])
        raise IndexError(
            f"id {int(ids[at])} of feature {feature} is outside its table of "
            f"{int(table_rows[feature])} rows"
        )
    first_row = (module.weights_offsets.long() // dim)[feature_of]
    return module.weights.view(-1, dim).index_select(0, first_row + ids)


def _forward(
    self: DenseTableBatchedEmbeddingBagsCodegen,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    *args,
    **kwargs,
) -> torch.Tensor:
    if self.pooling_mode != PoolingMode.NONE or self.weights.device.type != "cpu":
        return UPSTREAM_FORWARD(self, indices, offsets, *args, **kwargs)
    return unpooled_rows(self, indices, offsets)


def install() -> None:
    """Route unpooled CPU lookups of the dense kernel through `unpooled_rows` (idempotent)."""
    DenseTableBatchedEmbeddingBagsCodegen.forward = _forward  # type: ignore[method-assign]
