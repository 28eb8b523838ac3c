"""Which embedding tables exist: one table per sparse feature of a dataset."""

from __future__ import annotations

import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from shardrec.dataloader.format import Manifest


def table_name(feature: str) -> str:
    return f"t_{feature}"


def build_table_configs(
    manifest: Manifest,
    embedding_dim: int,
    dims: dict[str, int] | None = None,
) -> list[EmbeddingBagConfig]:
    """One sum-pooled table per sparse feature of the dataset.

    Args:
        manifest: the dataset's manifest; each feature's cardinality sizes its table.
        embedding_dim: width of every table unless `dims` names another for its feature.
        dims: feature name -> embedding width, for tables that differ from the default.
    """
    dims = dims or {}
    unknown = sorted(set(dims) - set(manifest.feature_names))
    if unknown:
        raise ValueError(f"model.dims names features the dataset does not have: {', '.join(unknown)}")
    configs = []
    for feat in manifest.sparse_features:
        rows = max(1, feat.cardinality)
        configs.append(
            EmbeddingBagConfig(
                name=table_name(feat.name),
                embedding_dim=dims.get(feat.name, embedding_dim),
                num_embeddings=rows,
                feature_names=[feat.name],
                pooling=PoolingType.SUM,
            )
        )
    return configs


def build_ebc(tables: list[EmbeddingBagConfig], device: str | torch.device = "meta") -> EmbeddingBagCollection:
    """An EmbeddingBagCollection; on the meta device, so sharding allocates only each rank's shards."""
    return EmbeddingBagCollection(tables=tables, device=torch.device(device))
