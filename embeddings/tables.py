"""Which embedding tables exist: one table per sparse feature of a dataset, and their weights'
names."""

from __future__ import annotations

import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from shardrec.dataloader.format.manifest import Manifest
from shardrec.embeddings.dims import table_name, table_specs

__all__ = ["POOLING_TYPES", "build_ebc", "build_table_configs", "table_name", "table_weight_fqn"]

POOLING_TYPES = {"sum": PoolingType.SUM, "mean": PoolingType.MEAN}
"""A sparse feature's pooling (the manifest's word, a spec's list column) -> its table's torchrec
pooling."""


def build_table_configs(
    manifest: Manifest,
    embedding_dim: int,
    dims: dict[str, int] | None = None,
) -> list[EmbeddingBagConfig]:
    """One table per sparse feature of the dataset, pooled as the feature says (sum, or mean for
    a spec's list column with `pooling = "mean"`).

    Args:
        manifest: the dataset's manifest; each feature's cardinality sizes its table.
        embedding_dim: width of every table unless `dims` names another for its feature.
        dims: feature name -> embedding width, for tables that differ from the default.
    """
    return [
        EmbeddingBagConfig(
            name=spec.name,
            embedding_dim=spec.dim,
            num_embeddings=spec.rows,
            feature_names=[spec.feature],
            pooling=POOLING_TYPES[spec.pooling],
        )
        for spec in table_specs(manifest, embedding_dim, dims)
    ]


def build_ebc(
    tables: list[EmbeddingBagConfig], device: str | torch.device = "meta"
) -> EmbeddingBagCollection:
    """An EmbeddingBagCollection; on the meta device, so sharding allocates only each rank's
    shards."""
    return EmbeddingBagCollection(tables=tables, device=torch.device(device))


def table_weight_fqn(ebc_path: str, table: str) -> str:
    """Name of a table's weight in a model whose EmbeddingBagCollection sits at `ebc_path` ("" for
    the collection itself): `<ebc_path>.embedding_bags.<table>.weight`, the name torchrec's
    collection gives it in the state dict (sharded or not) and in `named_parameters()` (unsharded or
    data-parallel)."""
    name = f"embedding_bags.{table}.weight"
    return f"{ebc_path}.{name}" if ebc_path else name
