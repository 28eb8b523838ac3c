"""An independent, plain implementation of the MLPerf DLRMv2 reference's multi-hot algorithm
(facebookresearch/dlrm torchrec_dlrm/multi_hot.py), written out for the tests to compare
shardrec's chunked tables and datasets against: numpy's global legacy generator seeded once,
then per table one big call for all its rows."""

from __future__ import annotations

import numpy as np


def reference_tables(
    sizes: list[int], rows: list[int], dist: str, seed: int = 0
) -> list[np.ndarray]:
    """Index table of each feature: row r is r, then size - 1 random ids in [0, rows)."""
    saved = np.random.get_state()
    try:
        np.random.seed(seed)
        tables = []
        for n, k in zip(rows, sizes):
            first = np.arange(n)[:, np.newaxis]
            if dist == "uniform":
                extra = np.random.randint(0, n, size=(n, k - 1))
            else:
                with np.errstate(invalid="ignore"):
                    extra = np.random.pareto(a=0.25, size=(n, k - 1)).astype(np.int32) % n
            tables.append(np.concatenate((first, extra), axis=-1).astype(np.int32))
        return tables
    finally:
        np.random.set_state(saved)


def reference_multihot(one_hot: np.ndarray, table: np.ndarray) -> np.ndarray:
    """The reference's lookup of one feature's one-hot ids: [rows, size] multi-hot ids."""
    return table[np.asarray(one_hot, np.int64) % len(table)]
