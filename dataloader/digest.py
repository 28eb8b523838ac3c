"""Stream digests: one SHA-256 per global batch, to prove two runs saw the same data.

A global batch's digest is computed over the ranks' slices concatenated in rank order,
field by field: labels (float32), dense (float32, row-major), then for each sparse feature
in manifest order its lengths (int32) and its ids (int64), all little-endian. Because
slices are contiguous row ranges of the global batch, the concatenation is the global batch
itself, so the digest is the same whatever the world size that produced it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torchrec takes seconds to import; the CLI imports this module eagerly
    from torchrec.datasets.utils import Batch


def batch_digest(slices: list[Batch], feature_names: list[str]) -> str:
    """SHA-256 (hex) of one global batch given every rank's slice in rank order."""
    h = hashlib.sha256()
    for field in ("labels", "dense_features"):
        for b in slices:
            h.update(_le(getattr(b, field).cpu().numpy(), np.float32))
    jagged = [b.sparse_features.to_dict() for b in slices]
    for name in feature_names:
        for part in jagged:
            h.update(_le(part[name].lengths().cpu().numpy(), np.int32))
        for part in jagged:
            h.update(_le(part[name].values().cpu().numpy(), np.int64))
    return h.hexdigest()


def _le(array: np.ndarray, dtype: type) -> bytes:
    return np.ascontiguousarray(array, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()


def stream_digests(loaders: list, start_batch: int, num_batches: int) -> Iterator[tuple[int, str]]:
    """(batch index, digest) for global batches start_batch .. start_batch + num_batches - 1.

    Args:
        loaders: one BatchLoader per rank, rank order, same epoch; read by random access.
    """
    names = loaders[0].feature_names
    stop = min(len(loaders[0]), start_batch + num_batches)
    for k in range(start_batch, stop):
        yield k, batch_digest([loader.batch(k) for loader in loaders], names)
