"""The tables of a dataset as plain values (name, feature, rows, width), the width checked against
it.

Kept free of torch and torchrec: the trainer's start-up checks and `shardrec export` call it,
where importing torchrec would cost seconds (tables.py makes torchrec's configs of them).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardrec.dataloader.format.manifest import Manifest


def table_name(feature: str) -> str:
    return f"t_{feature}"


@dataclass(frozen=True)
class TableSpec:
    """One table of one sparse feature; `pooling` is the feature's ("sum", or "mean" for a spec's
    list column)."""

    name: str
    feature: str
    rows: int
    dim: int
    pooling: str = "sum"


def table_dims(
    manifest: Manifest, embedding_dim: int, dims: dict[str, int] | None = None
) -> dict[str, int]:
    """Embedding width of each sparse feature's table: `dims` where it names the feature, else
    `embedding_dim`.

    Args:
        manifest: the dataset's manifest.
        embedding_dim: width of every table unless `dims` names another for its feature.
        dims: feature name -> embedding width (the job's `model.dims`).

    Raises:
        ValueError: `dims` names a feature the dataset does not have.
    """
    dims = dims or {}
    unknown = sorted(set(dims) - set(manifest.feature_names))
    if unknown:
        raise ValueError(
            f"model.dims names features the dataset does not have: {', '.join(unknown)}"
        )
    return {feat.name: dims.get(feat.name, embedding_dim) for feat in manifest.sparse_features}


def table_specs(
    manifest: Manifest, embedding_dim: int, dims: dict[str, int] | None = None
) -> list[TableSpec]:
    """One table per sparse feature of the dataset, in manifest order; its cardinality sizes it (at
    least one row) and `table_dims` gives its width."""
    widths = table_dims(manifest, embedding_dim, dims)
    return [
        TableSpec(
            table_name(feat.name),
            feat.name,
            max(1, feat.cardinality),
            widths[feat.name],
            feat.pooling,
        )
        for feat in manifest.sparse_features
    ]
