"""The memory a gatherer writes batches into: labels, dense rows and one-hot ids, each from a pool
of the memory of batches the consumer has let go of (util/buffer_pool.py).

Fresh arrays cost glibc's page faults and zeroing, up to 0.36 s of system CPU per 2,048 Criteo
batches, unevenly from round to round. A batch still held is never written over.
"""

from __future__ import annotations

import numpy as np

from shardrec.dataloader.util.buffer_pool import BufferPool

IDS_POOL_BYTES = 128 << 20
"""Memory of released batches' one-hot ids a gatherer keeps for its next gathers (buffer_pool.py):
~9 gathers of Criteo-shaped batches (8 x 8192 rows x 26 ids, 13.6 MB). The pools keep what was
in flight at once (prefetch runs per worker x workers + 1), below these caps; a gather larger
than a cap (a very large `gather_rows`) is allocated afresh each time."""
DENSE_POOL_BYTES = 32 << 20
"""The same for dense rows (8 x 8192 rows x 13 float32, 3.4 MB a gather)."""
LABELS_POOL_BYTES = 4 << 20
"""The same for labels (8 x 8192 float32, 0.26 MB a gather)."""


class BatchMemory:
    """Uninitialised arrays for one gather's labels, dense rows and one-hot ids, recycled."""

    def __init__(self, num_dense: int, num_features: int) -> None:
        self.num_dense, self.num_features = num_dense, num_features
        self._labels = BufferPool(np.float32, LABELS_POOL_BYTES)
        self._dense = BufferPool(np.float32, DENSE_POOL_BYTES)
        self._ids = BufferPool(np.int64, IDS_POOL_BYTES)

    def labels_dense(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Labels [n] and dense rows [n, num_dense]."""
        dense = self._dense.take(n * self.num_dense).reshape(n, self.num_dense)
        return self._labels.take(n), dense

    def ids(self, count: int, b: int) -> np.ndarray:
        """One-hot ids [count, features, b] of `count` batches of b rows."""
        return self._ids.take(count * self.num_features * b).reshape(count, -1, b)
