"""Plan files: where every table lives, and what it was planned for.

A plan file is JSON with a schema version, a fingerprint of the job it was planned for
(tables, world size, global batch size, device kind), the topology and the cost model's
estimate it was planned with, and one entry per table listing its shards explicitly (rank,
row/column offsets and sizes). Each part is a dataclass here, read (`load_plan`,
`PlanFile.from_json`) and written (`PlanFile.to_json`) in this module only. Training checks the fingerprint and
refuses a stale plan with a message that says what differs; `to_sharding_plan` turns the
file into the torchrec ShardingPlan that DistributedModelParallel takes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shardrec.dataloader.format.manifest import shown
from shardrec.dataloader.util.files import atomic_write_bytes
from shardrec.sharding.machine.json_checks import check_fields, check_plan_fields, expect, read_strict_json
from shardrec.sharding.machine.topology import ClusterTopology

if TYPE_CHECKING:  # torchrec is imported where a plan becomes torchrec's: reading one (`plan show`) needs no torch
    from torchrec.distributed.types import ParameterSharding, ShardingPlan
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

PLAN_FORMAT = "shardrec-plan"
PLAN_SCHEMA_VERSION = 1
DEVICE_KINDS = ("cpu", "cuda")
DATA_PARALLEL = "data_parallel"
SHARDING_TYPES = ("table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise", DATA_PARALLEL)
"""torchrec's ShardingType values that a plan file may name (tests/unit/test_plan_io.py checks them)."""


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
    """What every rank holds whatever its tables: dense layers, framework (sharding/machine/memory.py)."""
    cache_bytes: int = 0
    """Device memory of UVM caches on this rank."""
    host_bytes: int = 0
    """Host memory of UVM tables' weights on this rank."""
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
    """Memory of one rank's device before the reserve (0 in plans written before it was recorded)."""
    host_capacity_bytes: int = 0
    """Host memory per rank that UVM tables may use."""
    cost_model: str = ""
    """The step-time model shardrec's search optimised (shardrec or torchrec; "": not recorded)."""
    sync_every: int | None = None
    """2D plans only: steps between the replicas' weight synchronisations."""
    ids_per_sample: dict[str, float] = dataclasses.field(default_factory=dict)
    """The pooling factor (mean ids per sample) each table's lookups and comms were estimated with,
    for the tables where it is not 1 (list or multi-hot features)."""

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.sync_every is None:
            del out["sync_every"]  # written by 2D plans only
        # Figures a plan did not record stay out of its file, so older plans keep their bytes.
        for key in ("device_memory_bytes", "host_capacity_bytes", "cost_model", "ids_per_sample"):
            if not out[key]:
                del out[key]
        for rank in out["ranks"]:
            for key in ("fixed_bytes", "cache_bytes", "host_bytes"):
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
    """Predicted share of each shard's unique rows per batch found in the cache (sharding/cost/hit_rates.py)."""
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
    """The topology it was planned on (preset, ranks per host, memory, bandwidths); None: not recorded."""
    estimate: PlanEstimate | None = None
    """The cost model's per-rank figures at plan time (memory, compute, bytes moved); None: not recorded."""
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
        """The plan as its file holds it (a topology or estimate not recorded is an empty object)."""
        out = dataclasses.asdict(self)
        out["topology"] = self.topology.to_dict() if self.topology is not None else {}
        out["estimate"] = self.estimate.to_dict() if self.estimate is not None else {}
        return out

    def to_json(self) -> str:
        raw = self.to_dict()
        for table in raw["tables"]:
            if table["cache"] is None:  # only cached tables carry the key: other plans' bytes stay as they were
                del table["cache"]
        # sort_keys + fixed separators: the same plan always gives the same bytes.
        return json.dumps(raw, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> PlanFile:
        return _plan_from_dict(json.loads(text))


def _table_fingerprint(config: EmbeddingBagConfig) -> dict[str, Any]:
    return {
        "name": config.name,
        "rows": int(config.num_embeddings),
        "dim": int(config.embedding_dim),
        "features": list(config.feature_names),
        "pooling": config.pooling.name,
    }


def plan_fingerprint(
    configs: list[EmbeddingBagConfig], world_size: int, global_batch_size: int, device_kind: str
) -> PlanFingerprint:
    """What a plan depends on; two jobs with equal fingerprints can share a plan."""
    if device_kind not in DEVICE_KINDS:
        raise ValueError(f"device kind {device_kind!r} is not one of {', '.join(DEVICE_KINDS)}")
    body = {
        "tables": [_table_fingerprint(config) for config in configs],
        "world_size": int(world_size),
        "global_batch_size": int(global_batch_size),
        "device_kind": device_kind,
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return PlanFingerprint.from_dict({**body, "digest": digest})


def save_plan(plan: PlanFile, path: str | Path) -> None:
    """Write the plan as JSON under a temporary name, then rename it into place."""
    atomic_write_bytes(Path(path), plan.to_json().encode())


def _plan_from_dict(raw: dict[str, Any]) -> PlanFile:
    """The one reader of a plan's fields (load_plan checks their types first)."""
    table_plans = []
    for entry in raw["tables"]:
        shards = [Shard(**shard) for shard in entry["shards"]]
        cache = CachePlan(**entry["cache"]) if entry.get("cache") is not None else None
        table_plans.append(TablePlan(entry["name"], entry["sharding_type"], entry["compute_kernel"], shards, cache))
    rest = {key: value for key, value in raw.items() if key not in ("tables", "fingerprint", "topology", "estimate")}
    return PlanFile(
        tables=table_plans,
        fingerprint=PlanFingerprint.from_dict(raw["fingerprint"]),
        topology=ClusterTopology.from_dict(raw["topology"]) if raw.get("topology") else None,
        estimate=PlanEstimate.from_dict(raw["estimate"]) if raw.get("estimate") else None,
        **rest,
    )


def load_plan(path: str | Path) -> PlanFile:
    """Read a plan file; ValueError naming the path if it is not one this shardrec reads."""
    path = Path(path)
    raw = read_strict_json(path, "plan file")  # NaN and Infinity refused, naming the key
    if not isinstance(raw, dict) or raw.get("format") != PLAN_FORMAT:
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise ValueError(f"{path}: format is {shown(got)}, expected {PLAN_FORMAT!r} (make one with `shardrec plan`)")
    version = raw.get("schema_version")
    if isinstance(version, bool) or version != PLAN_SCHEMA_VERSION:
        raise ValueError(
            f"{path}: schema_version {shown(version)} is not supported (this shardrec reads {PLAN_SCHEMA_VERSION})"
        )
    check_plan_fields(path, raw)  # every field by type: a wrong one is named here, not inside the ranks
    if raw.get("topology"):
        check_fields(path, raw["topology"], ClusterTopology, "topology.")
    if raw.get("estimate"):
        check_fields(path, raw["estimate"], PlanEstimate, "estimate.")
        for i, rank in enumerate(raw["estimate"]["ranks"]):
            check_fields(
                path, expect(path, rank, "object", f"estimate.ranks[{i}]"), RankEstimate, f"estimate.ranks[{i}]."
            )
    try:
        plan = _plan_from_dict(raw)
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path}: malformed plan file: {e!r}") from None
    except ValueError as e:  # a topology whose figures cannot be (ClusterTopology's own checks)
        raise ValueError(f"{path}: {e}") from None
    for t in plan.tables:
        if t.sharding_type not in SHARDING_TYPES:
            raise ValueError(f"{path}: table {t.name}: unknown sharding_type {t.sharding_type!r}")
        if not t.shards:
            raise ValueError(f"{path}: table {t.name}: no shards")
        _check_cache(path, t, plan.fingerprint.device_kind)
    return plan


UVM_KERNELS = ("fused_uvm", "fused_uvm_caching")


def _check_cache(path: Path, t: TablePlan, device_kind: str | None) -> None:
    """A cache only on fused_uvm_caching, with a load factor in (0, 1) and one size per shard;
    UVM kernels only on CUDA (torchrec's sharders offer them nowhere else)."""
    if t.compute_kernel in UVM_KERNELS and device_kind != "cuda":
        raise ValueError(
            f"{path}: table {t.name}: compute_kernel {t.compute_kernel} needs CUDA, the plan is for {device_kind}"
        )
    if (t.compute_kernel == "fused_uvm_caching") != (t.cache is not None):
        raise ValueError(
            f"{path}: table {t.name}: a cache goes with compute_kernel fused_uvm_caching, and only with it"
        )
    if t.cache is None:
        return
    if not 0 < t.cache.load_factor < 1:
        raise ValueError(f"{path}: table {t.name}: cache.load_factor = {t.cache.load_factor} must lie in (0, 1)")
    if len(t.cache.rows) != len(t.shards) or len(t.cache.hit_rates) != len(t.shards):
        raise ValueError(f"{path}: table {t.name}: cache.rows and cache.hit_rates need one value per shard")
    if t.cache.algorithm not in ("lru", "lfu"):
        raise ValueError(f"{path}: table {t.name}: cache.algorithm = {t.cache.algorithm!r} is not lru or lfu")


def _describe_table_diff(planned: list[TableFingerprint], current: list[TableFingerprint]) -> list[str]:
    old = {t.name: t for t in planned}
    new = {t.name: t for t in current}
    out = []
    missing = sorted(set(new) - set(old))
    extra = sorted(set(old) - set(new))
    if missing:
        out.append(f"tables not in the plan: {', '.join(missing)}")
    if extra:
        out.append(f"tables in the plan but not in the job: {', '.join(extra)}")
    for name in sorted(set(old) & set(new)):
        for key in ("rows", "dim", "features", "pooling"):
            if getattr(old[name], key) != getattr(new[name], key):
                out.append(f"table {name} {key}: plan {getattr(old[name], key)}, job {getattr(new[name], key)}")
    return out


def check_plan(plan: PlanFile, fingerprint: PlanFingerprint) -> None:
    """Raise StalePlanError listing every difference between the plan's fingerprint and the job's."""
    planned = plan.fingerprint
    if planned.digest == fingerprint.digest:
        return
    diffs = []
    for key in ("world_size", "global_batch_size", "device_kind"):
        if getattr(planned, key) != getattr(fingerprint, key):
            diffs.append(f"{key.replace('_', ' ')}: plan {getattr(planned, key)}, job {getattr(fingerprint, key)}")
    diffs += _describe_table_diff(planned.tables, fingerprint.tables)
    if not diffs:  # same content, other order
        diffs.append("table order differs")
    rerun = "re-run `shardrec plan`"
    if planned.device_kind != fingerprint.device_kind:
        # The same command gives the same plan unless the topology changes with the machine.
        kind = fingerprint.device_kind
        rerun += (
            f" with `--topology auto` on the machine that trains, or the preset of its {kind} "
            "devices (`--topology cpu-gloo`, `a100`, `h100`, `h200`)"
        )
    raise StalePlanError("the plan was made for another job: " + "; ".join(diffs) + f" ({rerun})")


def _check_shards(table_plan: TablePlan, config: EmbeddingBagConfig, world_size: int) -> None:
    for s in table_plan.shards:
        if not 0 <= s.rank < world_size:
            raise ValueError(f"table {table_plan.name}: shard on rank {s.rank}, world size is {world_size}")
        if s.row_offset + s.rows > config.num_embeddings or s.col_offset + s.cols > config.embedding_dim:
            raise ValueError(
                f"table {table_plan.name}: shard {s} lies outside the table "
                f"[{config.num_embeddings} x {config.embedding_dim}]"
            )
    if table_plan.sharding_type == DATA_PARALLEL:
        return
    # Shards must tile the table: every weight in exactly one shard. On the grid that the
    # shards' own edges cut the table into, each cell is counted once per shard covering it.
    rows = np.unique(
        [0, config.num_embeddings] + [e for s in table_plan.shards for e in (s.row_offset, s.row_offset + s.rows)]
    )
    cols = np.unique(
        [0, config.embedding_dim] + [e for s in table_plan.shards for e in (s.col_offset, s.col_offset + s.cols)]
    )
    cover = np.zeros((len(rows) - 1, len(cols) - 1), dtype=np.int64)
    for s in table_plan.shards:
        r0, r1 = np.searchsorted(rows, [s.row_offset, s.row_offset + s.rows])
        c0, c1 = np.searchsorted(cols, [s.col_offset, s.col_offset + s.cols])
        cover[r0:r1, c0:c1] += 1
    if (cover > 1).any():
        raise ValueError(f"table {table_plan.name}: shards overlap")
    if (cover == 0).any():
        raise ValueError(
            f"table {table_plan.name}: shards leave part of the table "
            f"[{config.num_embeddings} x {config.embedding_dim}] uncovered"
        )


def to_parameter_sharding(t: TablePlan, device_kind: str, local_world_size: int) -> ParameterSharding:
    """One table's torchrec ParameterSharding (data-parallel tables carry no sharding spec)."""
    from torchrec.distributed.sharding_plan import placement
    from torchrec.distributed.types import EnumerableShardingSpec, ParameterSharding, ShardMetadata

    cache_params = None
    if t.cache is not None:
        from fbgemm_gpu.tbe.cache.cache_config import CacheAlgorithm
        from torchrec.distributed.types import CacheParams

        algorithm = CacheAlgorithm.LFU if t.cache.algorithm == "lfu" else CacheAlgorithm.LRU
        cache_params = CacheParams(algorithm=algorithm, load_factor=t.cache.load_factor)
    if t.sharding_type == DATA_PARALLEL:
        return ParameterSharding(sharding_type=t.sharding_type, compute_kernel=t.compute_kernel, ranks=t.ranks)
    spec = EnumerableShardingSpec(
        [
            ShardMetadata(
                shard_offsets=[s.row_offset, s.col_offset],
                shard_sizes=[s.rows, s.cols],
                placement=placement(device_kind, s.rank, local_world_size),
            )
            for s in t.shards
        ]
    )
    return ParameterSharding(
        sharding_type=t.sharding_type,
        compute_kernel=t.compute_kernel,
        ranks=t.ranks,
        sharding_spec=spec,
        cache_params=cache_params,
    )


def to_sharding_plan(
    plan: PlanFile,
    configs: list[EmbeddingBagConfig],
    module_path: str,
    world_size: int,
    local_world_size: int,
    device_kind: str,
) -> ShardingPlan:
    """The torchrec ShardingPlan for the EmbeddingBagCollection at `module_path`
    (e.g. "sparse_arch.embedding_bag_collection").

    For a 2D plan (sharding_group_size > 0) this is the plan of one sharding group, as
    DMPCollection(sharding_group_size=...) takes it. Raises ValueError if the plan does not
    place exactly the given tables within the ranks.
    """
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ShardingPlan

    if plan.sharding_group_size:
        # DMPCollection takes the plan of one sharding group and maps it onto every replica.
        world_size = plan.sharding_group_size
        local_world_size = min(local_world_size, world_size)
    by_name = {t.name: t for t in plan.tables}
    names = [config.name for config in configs]
    missing = [n for n in names if n not in by_name]
    extra = sorted(set(by_name) - set(names))
    if missing or extra:
        raise ValueError(
            f"plan does not match the model's tables (missing: {', '.join(missing) or 'none'}; "
            f"unknown: {', '.join(extra) or 'none'})"
        )
    module_plan = EmbeddingModuleShardingPlan()
    for config in configs:
        table_plan = by_name[config.name]
        _check_shards(table_plan, config, world_size)
        module_plan[config.name] = to_parameter_sharding(table_plan, device_kind, local_world_size)
    return ShardingPlan({module_path: module_plan})


def from_sharding_plan(
    module_plan: dict[str, ParameterSharding], configs: list[EmbeddingBagConfig], world_size: int
) -> list[TablePlan]:
    """Our per-table entries from a torchrec module plan (e.g. the one torchrec's planner made), in `configs` order."""
    out = []
    for config in configs:
        ps = module_plan[config.name]
        if ps.sharding_spec is None:
            ranks = ps.ranks if ps.ranks else list(range(world_size))
            shards = [Shard(r, 0, 0, config.num_embeddings, config.embedding_dim) for r in ranks]
        else:
            shards = [
                Shard(
                    md.placement.rank(), md.shard_offsets[0], md.shard_offsets[1], md.shard_sizes[0], md.shard_sizes[1]
                )
                for md in ps.sharding_spec.shards  # type: ignore[attr-defined]
            ]
        out.append(TablePlan(config.name, ps.sharding_type, ps.compute_kernel, shards))
    return out
