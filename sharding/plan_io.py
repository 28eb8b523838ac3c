"""Plan files: where every table lives, and what it was planned for.

A plan file is JSON with a schema version, a fingerprint of the job it was planned for
(tables, world size, global batch size, device kind) and one entry per table listing its
shards explicitly (rank, row/column offsets and sizes). Training checks the fingerprint and
refuses a stale plan with a message that says what differs; `to_sharding_plan` turns the
file into the torchrec ShardingPlan that DistributedModelParallel takes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shardrec.dataloader.files import atomic_write_bytes
from shardrec.dataloader.format import shown
from shardrec.sharding.json_checks import check_plan_fields, read_strict_json

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


@dataclass
class Shard:
    """One block of a table's weight [row_offset:+rows, col_offset:+cols] placed on `rank`."""

    rank: int
    row_offset: int
    col_offset: int
    rows: int
    cols: int


@dataclass
class TablePlan:
    name: str
    sharding_type: str
    compute_kernel: str
    shards: list[Shard]
    """Data-parallel tables list one full-size shard per rank."""

    @property
    def ranks(self) -> list[int]:
        return [s.rank for s in self.shards]


@dataclass
class PlanFile:
    schema_version: int
    fingerprint: dict[str, Any]
    tables: list[TablePlan]
    planner: str = "shardrec"
    """Which search produced the plan (shardrec or torchrec)."""
    topology: dict[str, Any] = field(default_factory=dict)
    """The topology it was planned on (preset, ranks per host, memory, bandwidths)."""
    estimate: dict[str, Any] = field(default_factory=dict)
    """The cost model's per-rank figures at plan time (memory, compute, bytes moved)."""
    sharding_group_size: int = 0
    """0: tables sharded over all ranks. G: 2D, shards on ranks 0..G-1 of each sharding group
    of G ranks, replicated world_size / G times (torchrec's DMPCollection, CUDA only)."""
    format: str = PLAN_FORMAT

    def table(self, name: str) -> TablePlan:
        for t in self.tables:
            if t.name == name:
                return t
        raise KeyError(name)

    def to_json(self) -> str:
        # sort_keys + fixed separators: the same plan always gives the same bytes.
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True) + "\n"

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
) -> dict[str, Any]:
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
    return {**body, "digest": digest}


def save_plan(plan: PlanFile, path: str | Path) -> None:
    """Write the plan as JSON under a temporary name, then rename it into place."""
    atomic_write_bytes(Path(path), plan.to_json().encode())


def _plan_from_dict(raw: dict[str, Any]) -> PlanFile:
    table_plans = []
    for entry in raw["tables"]:
        shards = [Shard(**shard) for shard in entry["shards"]]
        table_plans.append(TablePlan(entry["name"], entry["sharding_type"], entry["compute_kernel"], shards))
    rest = {key: value for key, value in raw.items() if key != "tables"}
    return PlanFile(tables=table_plans, **rest)


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
    try:
        plan = _plan_from_dict(raw)
    except (KeyError, TypeError) as e:
        raise ValueError(f"{path}: malformed plan file: {e!r}") from None
    for t in plan.tables:
        if t.sharding_type not in SHARDING_TYPES:
            raise ValueError(f"{path}: table {t.name}: unknown sharding_type {t.sharding_type!r}")
        if not t.shards:
            raise ValueError(f"{path}: table {t.name}: no shards")
    return plan


def _describe_table_diff(planned: list[dict], current: list[dict]) -> list[str]:
    old = {t["name"]: t for t in planned}
    new = {t["name"]: t for t in current}
    out = []
    missing = sorted(set(new) - set(old))
    extra = sorted(set(old) - set(new))
    if missing:
        out.append(f"tables not in the plan: {', '.join(missing)}")
    if extra:
        out.append(f"tables in the plan but not in the job: {', '.join(extra)}")
    for name in sorted(set(old) & set(new)):
        for key in ("rows", "dim", "features", "pooling"):
            if old[name][key] != new[name][key]:
                out.append(f"table {name} {key}: plan {old[name][key]}, job {new[name][key]}")
    return out


def check_plan(plan: PlanFile, fingerprint: dict[str, Any]) -> None:
    """Raise StalePlanError listing every difference between the plan's fingerprint and the job's."""
    planned = plan.fingerprint
    if planned.get("digest") == fingerprint.get("digest"):
        return
    diffs = []
    for key in ("world_size", "global_batch_size", "device_kind"):
        if planned.get(key) != fingerprint.get(key):
            diffs.append(f"{key.replace('_', ' ')}: plan {planned.get(key)}, job {fingerprint.get(key)}")
    diffs += _describe_table_diff(planned.get("tables", []), fingerprint.get("tables", []))
    if not diffs:  # same content, other order
        diffs.append("table order differs")
    raise StalePlanError("the plan was made for another job: " + "; ".join(diffs) + " (re-run `shardrec plan`)")


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
        sharding_type=t.sharding_type, compute_kernel=t.compute_kernel, ranks=t.ranks, sharding_spec=spec
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
