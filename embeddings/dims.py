"""The width of each table, checked against the dataset.

Kept free of torch and torchrec: the trainer's start-up checks call it before any rank starts,
where importing torchrec would cost seconds.
"""

from __future__ import annotations

from shardrec.dataloader.format import Manifest


def table_dims(manifest: Manifest, embedding_dim: int, dims: dict[str, int] | None = None) -> dict[str, int]:
    """Embedding width of each sparse feature's table: `dims` where it names the feature, else `embedding_dim`.

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
        raise ValueError(f"model.dims names features the dataset does not have: {', '.join(unknown)}")
    return {feat.name: dims.get(feat.name, embedding_dim) for feat in manifest.sparse_features}
