"""The planner's inputs as typed values: one placement problem, and what the dataset tells it.

`PlanRequest` is what `planner.plan_tables` is asked to place: the tables, the job's shape
(ranks, batch, device kind) and the planner's options. `SearchRequest` is what both searches
(shardrec's, shardrec_search.py; torchrec's, torchrec_planner.py) are asked to solve: one placement
problem over one set of ranks. `DatasetStatistics.from_manifest` is the one conversion of a
dataset manifest into planner inputs, used by `shardrec plan` and by the trainer when it
plans at start.

Names: `configs` are the tables' EmbeddingBagConfigs (what exists); TablePlans (where each
table lives) are what the planner returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.dataloader.format.manifest import Manifest
from shardrec.sharding.cost.hit_rates import FrequencyCurve
from shardrec.sharding.machine.memory import DenseFootprint
from shardrec.sharding.machine.topology import ClusterTopology
from shardrec.sharding.plan.constraints import TableConstraint
from shardrec.sharding.search.cached_tables import TableKernel


@dataclass(frozen=True)
class SearchRequest:
    """One placement problem: the tables, the machines, the batch and what each table may do."""

    configs: list[EmbeddingBagConfig]
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
    dense: DenseFootprint = field(default_factory=DenseFootprint)
    """The dense layers, which every rank holds beside its tables (memory.py)."""
    kernels: dict[str, TableKernel] = field(default_factory=dict)
    """Table name -> kernel past device memory (cached_tables.py); a missing table uses
    `compute_kernel`."""
    frequencies: dict[str, FrequencyCurve] = field(default_factory=dict)
    """Table name -> id-frequency curve (hit_rates.py), for cached tables' hit rates."""
    ids_by_frequency: bool = False
    """Ids are numbered hottest first (row-wise blocks of a cached table differ in hit rate)."""
    numbered_ids: dict[str, str] = field(default_factory=dict)
    """DatasetStatistics.numbered_ids: what a table too large for any rank says to fix."""


@dataclass(frozen=True)
class DatasetStatistics:
    """What a dataset tells the planner: per-feature statistics and how ids are numbered."""

    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Feature name -> the manifest's statistics (tools/preprocess/parts/feature_stats.py)."""
    ids_by_frequency: bool = False
    """Ids are numbered hottest first, so row-wise blocks are skewed (skew.py)."""
    frequencies: dict[str, FrequencyCurve] = field(default_factory=dict)
    """Table name -> its ids' frequency curve measured on the data (hit_rates.py); what the planner
    sizes UVM caches by on CUDA topologies whose HBM cannot hold every table. Empty: not
    measured."""
    numbered_ids: dict[str, str] = field(default_factory=dict)
    """Feature name -> what its ids are ("user", "item", ...) where its table has a row per id up
    to the largest (an event log's): a table too large for any rank is then the ids' numbering to
    fix."""

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> DatasetStatistics:
        return cls(
            stats={f.name: f.stats for f in manifest.sparse_features},
            # A vocabulary (preprocess --min-count) numbers ids hottest first.
            ids_by_frequency=manifest.options.get("mode") == "vocab",
            # An event log's user, item, artist and album ids are rows of their tables.
            numbered_ids=(
                {"uid": "user", **{f.name: f.table for f in manifest.sparse_features if f.table}}
                if manifest.kind == "events"
                else {}
            ),
        )


@dataclass(frozen=True)
class PlanRequest:
    """Everything `plan_tables` places the tables by: the job's shape and the planner's options."""

    configs: list[EmbeddingBagConfig]
    world_size: int
    local_world_size: int
    global_batch_size: int
    device_kind: str
    """cpu or cuda; it picks the default topology and goes into the plan's fingerprint."""
    constraints: dict[str, dict[str, Any]] | None = None
    """Table name -> ParameterConstraints fields (plus `ranks`), as the job file's
    [sharding.constraints]."""
    statistics: DatasetStatistics = field(default_factory=DatasetStatistics)
    """What the dataset says: per-feature mean ids per sample and lookup skew
    (DatasetStatistics.from_manifest)."""
    topology: ClusterTopology | None = None
    """The machines; None: the cpu-gloo or h100 preset for `device_kind`."""
    compute_kernel: str = "fused"
    optimizer: str = "rowwise_adagrad"
    """The sparse optimizer, whose state the memory estimate counts
    (shardrec.embeddings.sparse_optimizers)."""
    dense: DenseFootprint = field(default_factory=DenseFootprint)
    """The dense layers: parameters, activations and optimizer, which the memory estimate
    counts on every rank (memory.dense_footprint of the model; none by default)."""
    sharding_group_size: int = 0
    """0: shard over all ranks; G: 2D, shard over groups of G ranks (torchrec's DMPCollection);
    -1: pick the fastest of all ranks and 2D group sizes."""
    sync_every: int = 1
    """2D only: steps between the replicas' weight synchronisations."""

    def __post_init__(self) -> None:
        if self.global_batch_size % self.world_size:
            raise ValueError(
                f"global batch size {self.global_batch_size} is not divisible by world size {self.world_size}"
            )
        if self.sync_every <= 0:
            raise ValueError(f"sync_every = {self.sync_every} must be positive")
