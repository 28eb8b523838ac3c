"""The planner's inputs as typed values: one placement problem, and what the dataset tells it.

`SearchRequest` is what both searches (shardrec's, search.py; torchrec's,
torchrec_planner.py) are asked to solve. `DatasetStatistics.from_manifest` is the one
conversion of a dataset manifest into planner inputs, used by `shardrec plan` and by the
trainer when it plans at start.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.dataloader.format import Manifest
from shardrec.sharding.constraints import TableConstraint
from shardrec.sharding.topology import ClusterTopology


@dataclass(frozen=True)
class SearchRequest:
    """One placement problem: the tables, the machines, the batch and what each table may do."""

    tables: list[EmbeddingBagConfig]
    topology: ClusterTopology
    global_batch_size: int
    pooling: dict[str, float]
    """Table name -> mean ids per sample."""
    constraints: dict[str, TableConstraint] = field(default_factory=dict)
    """Table name -> parsed constraint (constraints.py); a missing table is unconstrained."""
    compute_kernel: str = "fused"
    optimizer: str = "rowwise_adagrad"
    curves: dict[str, Any] | None = None
    """Table name -> lookup skew of row-wise blocks (skew.py); shardrec's cost model only."""


@dataclass(frozen=True)
class DatasetStatistics:
    """What a dataset tells the planner: per-feature statistics and how ids are numbered."""

    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Feature name -> the manifest's statistics (tools/preprocess/stats.py)."""
    ids_by_frequency: bool = False
    """Ids are numbered hottest first, so row-wise blocks are skewed (skew.py)."""

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> "DatasetStatistics":
        return cls(
            stats={f.name: f.stats for f in manifest.sparse_features},
            # A vocabulary (preprocess --min-count) numbers ids hottest first.
            ids_by_frequency=manifest.options.get("mode") == "vocab",
        )
