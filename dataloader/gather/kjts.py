"""Gathered ids turned into torchrec KeyedJaggedTensors, one per batch.

One-hot features share a cached all-ones lengths tensor and give every per-key length and offset,
as torchrec's own Criteo pipe does, so the KeyedJaggedTensor needs no sync.
"""

from __future__ import annotations

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shardrec.dataloader.multihot.multihot_tables import IndexTables


class KjtMaker:
    """KeyedJaggedTensors of one feature list; with index tables, each one-hot id becomes its
    multi-hot ids (`compiled`: by the kernels)."""

    def __init__(
        self, feature_names: list[str], index_tables: IndexTables | None, compiled: bool
    ) -> None:
        self.feature_names = list(feature_names)
        self.index_tables, self.compiled = index_tables, compiled
        self._index_per_key = {k: i for i, k in enumerate(self.feature_names)}
        self._ones = torch.ones(0, dtype=torch.int32)

    def one_hot(self, values: np.ndarray, b: int) -> list[KeyedJaggedTensor]:
        """One KeyedJaggedTensor per slice of one-hot ids [slices, features, b]; with index
        tables, each id becomes its table row (ids feature-major, as a materialised dataset's)."""
        if self.index_tables is None:
            return [self.make(v.reshape(-1), None, b) for v in values]
        return [self.make(*self.index_tables.expand_batch(v, self.compiled), b) for v in values]

    def make(self, values: np.ndarray, lengths: np.ndarray | None, n: int) -> KeyedJaggedTensor:
        """The KeyedJaggedTensor of n rows: values feature-major, lengths [features * n] (None:
        one id a row and feature)."""
        nf = len(self.feature_names)
        if lengths is None:
            # One-hot: every per-key length and offset is known, so no tensor sync is needed.
            return KeyedJaggedTensor(
                keys=self.feature_names,
                values=torch.from_numpy(values),
                lengths=self._ones_lengths(nf * n),
                stride=n,
                length_per_key=[n] * nf,
                offset_per_key=[n * i for i in range(nf + 1)],
                index_per_key=self._index_per_key,
            )
        per_key = lengths.reshape(nf, n).sum(axis=1)
        return KeyedJaggedTensor(
            keys=self.feature_names,
            values=torch.from_numpy(values),
            lengths=torch.from_numpy(lengths),
            stride=n,
            length_per_key=per_key.tolist(),
            offset_per_key=np.concatenate([[0], np.cumsum(per_key)]).tolist(),
            index_per_key=self._index_per_key,
        )

    def _ones_lengths(self, n: int) -> torch.Tensor:
        if len(self._ones) < n:
            self._ones = torch.ones(n, dtype=torch.int32)
        return self._ones[:n]
