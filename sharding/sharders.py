"""Sharders that offer every sharding type on every device.

torchrec offers row-wise and table-row-wise sharding only on CUDA, by policy; on CPU with
gloo they run and match the unsharded module exactly (tests/distributed), so shardrec's
sharders return all six types everywhere and let the plan choose.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ModuleSharder, ShardingType

ALL_SHARDING_TYPES: tuple[str, ...] = (
    ShardingType.TABLE_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.TABLE_COLUMN_WISE.value,
    ShardingType.DATA_PARALLEL.value,
)


class AnyDeviceEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """EmbeddingBagCollectionSharder whose sharding types do not depend on the device."""

    def sharding_types(self, compute_device_type: str) -> list[str]:
        return list(ALL_SHARDING_TYPES)


def build_sharders(
    fused_params: dict[str, Any] | None = None, qcomm_precision: str | None = None
) -> list[ModuleSharder[nn.Module]]:
    """The sharders shardrec plans and trains with.

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
        AnyDeviceEmbeddingBagCollectionSharder(fused_params=fused_params, qcomm_codecs_registry=qcomm_codecs_registry)
    ]
