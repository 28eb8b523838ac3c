"""Table sets for benchmarking planners and simulating scale (no data needed, only shapes).

- `criteo_dlrmv2`: the 26 tables of MLPerf DLRMv2 (Criteo 1TB, ids capped at 40 M rows),
  dim 128, with the multi-hot sizes of MLPerf's synthetic multi-hot Criteo as pooling factors.
- `random_tasks`: DreamShard/NeuroShard-style task sets: tables drawn at random (log-uniform
  rows and pooling, dims from {16, 32, 64, 128}), as those papers build their benchmarks from
  samples of a production table pool.
- `production_like`: a 1,000-table set with a heavy tail (many small tables, a few huge ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if (
    TYPE_CHECKING
):  # torchrec costs seconds to import; DLRMV2_ROWS alone is read without it (bench scale)
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

# MLPerf DLRMv2 training: rows per table (max_ind_range 40 M) and multi-hot sizes.
DLRMV2_ROWS = (
    40000000,
    39060,
    17295,
    7424,
    20265,
    3,
    7122,
    1543,
    63,
    40000000,
    3067956,
    405282,
    10,
    2209,
    11938,
    155,
    4,
    976,
    14,
    40000000,
    40000000,
    40000000,
    590152,
    12973,
    108,
    36,
)
DLRMV2_POOLING = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)


@dataclass
class TableSet:
    name: str
    configs: list[EmbeddingBagConfig]
    pooling: dict[str, float]


def table_config(i: int, rows: int, dim: int) -> EmbeddingBagConfig:
    """Table `t_i` of `rows` x `dim` for feature `f_i` (the suites' naming)."""
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    return EmbeddingBagConfig(
        name=f"t_{i}", embedding_dim=dim, num_embeddings=int(rows), feature_names=[f"f_{i}"]
    )


def criteo_dlrmv2(dim: int = 128) -> TableSet:
    configs = [table_config(i, rows, dim) for i, rows in enumerate(DLRMV2_ROWS)]
    return TableSet(
        "criteo26-dlrmv2", configs, {t.name: float(p) for t, p in zip(configs, DLRMV2_POOLING)}
    )


def random_tasks(seed: int, num_tables: int, max_rows: float = 1e7) -> TableSet:
    rng = np.random.default_rng([seed, 5])
    rows = np.exp(rng.uniform(np.log(100), np.log(max_rows), num_tables)).astype(np.int64)
    dims = rng.choice([16, 32, 64, 128], num_tables)
    pooling = np.exp(rng.uniform(0, np.log(60), num_tables))
    configs = [table_config(i, r, int(d)) for i, (r, d) in enumerate(zip(rows, dims))]
    return TableSet(
        f"random-{num_tables}t-s{seed}",
        configs,
        {t.name: round(float(p), 3) for t, p in zip(configs, pooling)},
    )


def production_like(num_tables: int = 1000, seed: int = 0) -> TableSet:
    rng = np.random.default_rng([seed, 7])
    rows = np.minimum(np.exp(rng.normal(np.log(2e4), 2.6, num_tables)), 2e8).astype(np.int64) + 2
    dims = rng.choice([8, 16, 32, 64, 128, 256], num_tables, p=[0.1, 0.25, 0.25, 0.2, 0.15, 0.05])
    pooling = np.minimum(np.exp(rng.normal(0.5, 1.3, num_tables)), 200)
    configs = [table_config(i, r, int(d)) for i, (r, d) in enumerate(zip(rows, dims))]
    return TableSet(
        f"production-{num_tables}t",
        configs,
        {t.name: round(float(p), 3) for t, p in zip(configs, pooling)},
    )


def subset(ts: TableSet, count: int) -> TableSet:
    configs = ts.configs[:count]
    return TableSet(f"{ts.name}[:{count}]", configs, {c.name: ts.pooling[c.name] for c in configs})
