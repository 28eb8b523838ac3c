"""Which embedding tables exist: one table per sparse feature of a dataset (or per table that
features share), and their weights' names. A pooled table lives in an EmbeddingBagCollection; a
sequence model's unpooled tables (pooling NONE) in an EmbeddingCollection beside it."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from shardrec.dataloader.format.manifest import Manifest
from shardrec.embeddings.dims import UNPOOLED, table_name, table_specs
from shardrec.embeddings.managed.table_kinds import TableSettings

__all__ = [
    "POOLING_TYPES",
    "build_ebc",
    "build_ec",
    "build_table_configs",
    "is_unpooled",
    "table_name",
    "table_weight_fqn",
]

POOLING_TYPES = {"sum": PoolingType.SUM, "mean": PoolingType.MEAN, UNPOOLED: PoolingType.NONE}
"""A sparse feature's pooling (the manifest's word, a spec's list column) -> its table's torchrec
pooling; "none" marks a sequence model's unpooled table."""


def build_table_configs(
    manifest: Manifest,
    embedding_dim: int,
    dims: dict[str, int] | None = None,
    tables: Mapping[str, TableSettings] | None = None,
    *,
    unpooled_sequences: bool = False,
) -> list[EmbeddingBagConfig]:
    """One table per sparse feature of the dataset, pooled as the feature says (sum, or mean for
    a spec's list column with `pooling = "mean"`).

    Args:
        manifest: the dataset's manifest; each feature's cardinality sizes its table.
        embedding_dim: width of every table unless `dims` names another for its feature.
        dims: feature name -> embedding width, for tables that differ from the default.
        tables: feature name -> its table's settings (a raw-id feature's kind and rows).
        unpooled_sequences: a sequence model's tables: those its sequence features read get
            PoolingType.NONE (looked up unpooled, in the model's EmbeddingCollection).
    """
    return [
        EmbeddingBagConfig(
            name=spec.name,
            embedding_dim=spec.dim,
            num_embeddings=spec.rows,
            feature_names=spec.features,
            pooling=POOLING_TYPES[spec.pooling],
        )
        for spec in table_specs(
            manifest, embedding_dim, dims, tables, unpooled_sequences=unpooled_sequences
        )
    ]


def is_unpooled(table: EmbeddingBagConfig) -> bool:
    """A sequence model's table, looked up unpooled by its EmbeddingCollection."""
    return table.pooling == PoolingType.NONE


def build_ebc(
    tables: list[EmbeddingBagConfig], device: str | torch.device = "meta"
) -> EmbeddingBagCollection:
    """An EmbeddingBagCollection; on the meta device, so sharding allocates only each rank's
    shards."""
    return EmbeddingBagCollection(tables=tables, device=torch.device(device))


def build_ec(
    tables: list[EmbeddingBagConfig], device: str | torch.device = "meta"
) -> EmbeddingCollection:
    """An EmbeddingCollection of the unpooled tables (torchrec wants one width for all of them)."""
    widths = sorted({t.embedding_dim for t in tables})
    if len(widths) > 1:
        raise ValueError(
            f"a sequence model's tables need one width (torchrec's EmbeddingCollection), found {widths}"
        )
    configs = [
        EmbeddingConfig(
            name=t.name,
            embedding_dim=t.embedding_dim,
            num_embeddings=t.num_embeddings,
            feature_names=list(t.feature_names),
        )
        for t in tables
    ]
    return EmbeddingCollection(tables=configs, device=torch.device(device))


def table_weight_fqn(ebc_path: str, table: str, unpooled: bool = False) -> str:
    """Name of a table's weight in a model whose EmbeddingBagCollection sits at `ebc_path` ("" for
    the collection itself): `<ebc_path>.embedding_bags.<table>.weight`, the name torchrec's
    collection gives it in the state dict (sharded or not) and in `named_parameters()` (unsharded or
    data-parallel); `unpooled`: the table of an EmbeddingCollection at `ebc_path`,
    `<ebc_path>.embeddings.<table>.weight`."""
    name = f"{'embeddings' if unpooled else 'embedding_bags'}.{table}.weight"
    return f"{ebc_path}.{name}" if ebc_path else name
