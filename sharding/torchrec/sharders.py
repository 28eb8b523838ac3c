"""Sharders that offer every sharding type on every device, and the compute kernels they run where.

torchrec offers row-wise and table-row-wise sharding only on CUDA, by policy; on CPU with
gloo they run and match the unsharded module exactly (tests/distributed; a rank that a row-wise
table leaves without rows needs the CPU correction of empty_shards_cpu.py, installed with the
sharders), so shardrec's sharders return all six types everywhere and let the plan choose. The UVM kernels (weights in
host memory, read by the GPU over the host link, with or without an HBM cache) exist on CUDA only.

A sequence model's unpooled tables live in an EmbeddingCollection, whose sharder builds four
types (data-parallel, table-, column- and row-wise; table-row-wise and table-column-wise fail in
torchrec's `create_embedding_sharding`): the same on every device. Its data-parallel tables need
the CPU correction of unpooled_cpu.py, installed with the sharder.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embedding_sharding import USE_ONE_TBE_PER_TABLE
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ModuleSharder, ShardingType

from shardrec.sharding.plan.plan_types import SEQUENCE_SHARDING_TYPES, UVM_KERNELS, PlanFile
from shardrec.sharding.torchrec import empty_shards_cpu, unpooled_cpu

ALL_SHARDING_TYPES: tuple[str, ...] = (
    ShardingType.TABLE_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.TABLE_COLUMN_WISE.value,
    ShardingType.DATA_PARALLEL.value,
)

FUSED_KERNELS: tuple[str, ...] = ("fused", *UVM_KERNELS)
"""Compute kernels with the sparse optimizer fused into fbgemm's backward: weights in HBM (fused),
in host memory (fused_uvm), in host memory behind an HBM cache (fused_uvm_caching)."""


def needs_one_tbe_per_table(plan: PlanFile) -> bool:
    """Whether two cached tables share a rank. torchrec groups such tables into one fbgemm TBE,
    whose one cache is sized by the tables' average load factor and shared by their rows; the
    planner sized and priced one cache per table, which torchrec's use_one_tbe_per_table keeps (for
    every table of the plan: the switch is the sharder's, not a table's; a lone cached table needs
    none, its cache settings already keep it out of the other tables' TBE)."""
    cached: dict[int, set[str]] = {}
    for t in plan.tables:
        if t.compute_kernel == "fused_uvm_caching":
            for rank in t.ranks:
                cached.setdefault(rank, set()).add(t.name)
    return any(len(names) > 1 for names in cached.values())


def plan_fused_params(plan: PlanFile, fused_params: dict[str, Any] | None = None) -> dict[str, Any]:
    """`fused_params` with what `plan` needs of the sharders (use_one_tbe_per_table where cached
    tables would share a TBE); each table's cache itself comes with its ParameterSharding's
    CacheParams."""
    out = dict(fused_params or {})
    if needs_one_tbe_per_table(plan):
        out[USE_ONE_TBE_PER_TABLE] = True
    return out


class AnyDeviceEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """EmbeddingBagCollectionSharder whose sharding types do not depend on the device (on CPU
    with the correction of empty_shards_cpu.py for ranks a row-wise table leaves without rows)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        empty_shards_cpu.install()

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return list(ALL_SHARDING_TYPES)


class AnyDeviceEmbeddingCollectionSharder(EmbeddingCollectionSharder):
    """EmbeddingCollectionSharder with the four types torchrec can build, on every device."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        unpooled_cpu.install()
        empty_shards_cpu.install()

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return list(SEQUENCE_SHARDING_TYPES)


def build_sharders(
    fused_params: dict[str, Any] | None = None, qcomm_precision: str | None = None
) -> list[ModuleSharder[nn.Module]]:
    """The sharders shardrec plans and trains with: pooled tables' and a sequence model's unpooled
    ones.

    Args:
        fused_params: the fused embedding optimizer applied in backward (fbgemm's
            `optimizer`, `learning_rate`, `eps`, ...); None for torchrec's default.
        qcomm_precision: "fp16" or "bf16" to quantize the embedding all-to-all, None for fp32.
    """
    qcomm_codecs_registry = None
    if qcomm_precision is not None:
        from torchrec.distributed.fbgemm_qcomm_codec import (
            CommType,
            QCommsConfig,
            get_qcomm_codecs_registry,
        )

        precision = {"fp16": CommType.FP16, "bf16": CommType.BF16}.get(qcomm_precision)
        if precision is None:
            raise ValueError(f"qcomm precision {qcomm_precision!r} is not one of fp16, bf16")
        qcomm_codecs_registry = get_qcomm_codecs_registry(
            QCommsConfig(forward_precision=precision, backward_precision=precision)
        )
    return [
        AnyDeviceEmbeddingBagCollectionSharder(
            fused_params=fused_params, qcomm_codecs_registry=qcomm_codecs_registry
        ),
        AnyDeviceEmbeddingCollectionSharder(
            fused_params=fused_params, qcomm_codecs_registry=qcomm_codecs_registry
        ),
    ]
