"""What a plan is: where every table lives, and what it was planned for, as dataclasses.

A plan file is JSON with a schema version, a fingerprint of the job it was planned for
(tables, world size, global batch size, device kind), the topology and the cost model's
estimate it was planned with, and one entry per table listing its shards explicitly (rank,
row/column offsets and sizes). Each part is a dataclass here, turned into JSON and back here
only (`PlanFile.to_json`, `PlanFile.from_dict`); plan_file.py reads and checks files,
sharding/torchrec/torchrec_plans.py turns a plan into torchrec's ShardingPlan.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from shardrec.sharding.machine.topology import ClusterTopology

PLAN_FORMAT = "shardrec-plan"
PLAN_SCHEMA_VERSION = 1
DEVICE_KINDS = ("cpu", "cuda")
DATA_PARALLEL = "data_parallel"
SHARDING_TYPES = (
    "table_wise",
    "row_wise",
    "column_wise",
    "table_row_wise",
    "table_column_wise",
    DATA_PARALLEL,
)
"""torchrec's ShardingType values that a plan file may name (tests/unit/test_plan_io.py checks
them)."""
SEQUENCE_SHARDING_TYPES = ("data_parallel", "table_wise", "column_wise", "row_wise")
"""The types torchrec's EmbeddingCollection sharder builds: a sequence model's unpooled tables
(pooling NONE in the fingerprint) take only these."""
UNPOOLED = "NONE"
"""A table's pooling in a plan's fingerprint when a sequence model looks it up unpooled."""


class StalePlanError(ValueError):
    """A plan file made for other tables, world size, batch size or device kind."""


@dataclass(frozen=True)
class TableFingerprint:
    """What a plan knows of one table it placed."""

    name: str
    rows: int
    dim: int
    features: list[str]
    pooling: str
    """torchrec's PoolingType name (SUM, MEAN)."""


@dataclass(frozen=True)
class PlanFingerprint:
    """What a plan depends on; two jobs with equal fingerprints (equal digests) can share a plan."""

    tables: list[TableFingerprint]
    world_size: int
    global_batch_size: int
    device_kind: str
    digest: str
    """sha256 (16 hex digits) of the other fields, as JSON with sorted keys."""

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> PlanFingerprint:
        return cls(**{**raw, "tables": [TableFingerprint(**t) for t in raw["tables"]]})


@dataclass(frozen=True)
class RankEstimate:
    """The cost model's figures of one rank (sharding.cost.PlanCost.to_dict)."""

    rank: int
    memory_bytes: int
    weights_bytes: int
    optimizer_bytes: int
    buffer_bytes: int
    fixed_bytes: int = 0
    """What every rank holds whatever its tables: dense layers, framework
    (sharding/machine/memory.py)."""
    cache_bytes: int = 0
    """Device memory of UVM caches on this rank."""
    host_bytes: int = 0
    """Host memory of UVM tables' weights on this rank."""
    id_map_bytes: int = 0
    """The managed tables' id maps on this rank (in `fixed_bytes` on CPU; host memory on CUDA)."""
    lookup_ms: float = 0.0
    comm_ms: float = 0.0
    step_ms: float = 0.0
    bytes_sent: dict[str, int] = dataclasses.field(default_factory=dict)
    """Collective kind (all_to_all, reduce_scatter, all_gather, all_reduce) -> bytes per step."""


@dataclass(frozen=True)
class PlanEstimate:
    """The cost model's per-rank figures at plan time."""

    max_step_ms: float
    critical_rank: int
    memory_capacity_bytes: int
    ranks: list[RankEstimate]
    device_memory_bytes: int = 0
    """Memory of one rank's device before the reserve (0 in plans written before it was
    recorded)."""
    host_capacity_bytes: int = 0
    """Host memory per rank that UVM tables may use."""
    cost_model: str = ""
    """The step-time model shardrec's search optimised (shardrec or torchrec; "": not recorded)."""
    sync_every: int | None = None
    """2D plans only: steps between the replicas' weight synchronisations."""
    ids_per_sample: dict[str, float] = dataclasses.field(default_factory=dict)
    """The pooling factor (mean ids per sample) each table's lookups and comms were estimated with,
    for the tables where it is not 1 (list or multi-hot features)."""
    dense_param_bytes: int = 0
    """Parameter bytes of the dense layers (everything outside the tables) in every rank's
    `fixed_bytes` (0: not recorded, as in plans written before it was)."""

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.sync_every is None:
            del out["sync_every"]  # written by 2D plans only
        # Figures a plan did not record stay out of its file, so older plans keep their bytes.
        for key in (
            "device_memory_bytes",
            "host_capacity_bytes",
            "cost_model",
            "ids_per_sample",
            "dense_param_bytes",
        ):
            if not out[key]:
                del out[key]
        for rank in out["ranks"]:
            for key in ("fixed_bytes", "cache_bytes", "host_bytes", "id_map_bytes"):
                if not rank[key]:
                    del rank[key]
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> PlanEstimate:
        return cls(**{**raw, "ranks": [RankEstimate(**r) for r in raw["ranks"]]})


@dataclass
class Shard:
    """One block of a table's weight [row_offset:+rows, col_offset:+cols] placed on `rank`."""

    rank: int
    row_offset: int
    col_offset: int
    rows: int
    cols: int


@dataclass
class CachePlan:
    """The HBM cache of a table on the fused_uvm_caching kernel (weights in host memory)."""

    load_factor: float
    """Share of each shard's rows the cache holds (torchrec's CacheParams.load_factor)."""
    rows: list[int]
    """Rows (slots) fbgemm allocates for each shard's cache, in shard order."""
    hit_rates: list[float]
    """Predicted share of each shard's unique rows per batch found in the cache
    (sharding/cost/hit_rates.py)."""
    fetched_rows: list[float] = dataclasses.field(default_factory=list)
    """Predicted rows each shard fetches from host memory per batch (its unique misses)."""
    algorithm: str = "lru"


@dataclass
class TablePlan:
    name: str
    sharding_type: str
    compute_kernel: str
    shards: list[Shard]
    """Data-parallel tables list one full-size shard per rank."""
    cache: CachePlan | None = None
    """fused_uvm_caching tables: the cache and its predicted hit rates (None for other kernels)."""

    @property
    def ranks(self) -> list[int]:
        return [s.rank for s in self.shards]


@dataclass
class PlanFile:
    schema_version: int
    fingerprint: PlanFingerprint
    tables: list[TablePlan]
    planner: str = "shardrec"
    """Which search produced the plan (shardrec or torchrec)."""
    topology: ClusterTopology | None = None
    """The topology it was planned on (preset, ranks per host, memory, bandwidths); None: not
    recorded."""
    estimate: PlanEstimate | None = None
    """The cost model's per-rank figures at plan time (memory, compute, bytes moved); None: not
    recorded."""
    sharding_group_size: int = 0
    """0: tables sharded over all ranks. G: 2D, shards on ranks 0..G-1 of each sharding group
    of G ranks, replicated world_size / G times (torchrec's DMPCollection, CUDA only)."""
    format: str = PLAN_FORMAT

    def table(self, name: str) -> TablePlan:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """The plan as its file holds it (a topology or estimate not recorded is an empty
        object)."""
        out = dataclasses.asdict(self)
        out["topology"] = self.topology.to_dict() if self.topology is not None else {}
        out["estimate"] = self.estimate.to_dict() if self.estimate is not None else {}
        return out

    def to_json(self) -> str:
        raw = self.to_dict()
        for table in raw["tables"]:
            if (
                table["cache"] is None
            ):  # only cached tables carry the key: other plans' bytes stay as they were
                del table["cache"]
        # sort_keys + fixed separators: the same plan always gives the same bytes.
        return json.dumps(raw, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> PlanFile:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> PlanFile:
        """The one reader of a plan's fields (load_plan checks their types first)."""
        table_plans = []
        for entry in raw["tables"]:
            shards = [Shard(**shard) for shard in entry["shards"]]
            cache = CachePlan(**entry["cache"]) if entry.get("cache") is not None else None
            table_plans.append(
                TablePlan(
                    entry["name"], entry["sharding_type"], entry["compute_kernel"], shards, cache
                )
            )
        rest = {
            key: value
            for key, value in raw.items()
            if key not in ("tables", "fingerprint", "topology", "estimate")
        }
        return cls(
            tables=table_plans,
            fingerprint=PlanFingerprint.from_dict(raw["fingerprint"]),
            topology=ClusterTopology.from_dict(raw["topology"]) if raw.get("topology") else None,
            estimate=PlanEstimate.from_dict(raw["estimate"]) if raw.get("estimate") else None,
            **rest,
        )


UVM_KERNELS = ("fused_uvm", "fused_uvm_caching")
"""Compute kernels that keep a table in host memory (UVM), with or without an HBM cache."""
PLAN_KERNELS = ("fused", "dense", *UVM_KERNELS)
"""torchrec's EmbeddingComputeKernel values that a plan file may name (dense: data-parallel)."""


class PlanDoesNotFitError(ValueError):
    """No placement within the ranks' memory; the message gives each rank's shortfall.
    least_hbm: where every table went to host memory and it still did not fit, each short rank's
    HBM need then (bytes): the least HBM a rank must have (`bench hitrate` sizes its advice by it).
    short_bytes: the bytes missing over all short ranks and memory tiers (0: not measured, as with
    torchrec's planner), by which `shardrec plan` cuts the managed tables' proposed rows.
    """

    def __init__(
        self, message: str, least_hbm: dict[int, float] | None = None, short_bytes: float = 0.0
    ) -> None:
        super().__init__(message)
        self.least_hbm = least_hbm or {}
        self.short_bytes = short_bytes
