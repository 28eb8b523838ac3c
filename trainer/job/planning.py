"""The one conversion of a job into the planner's request: what `shardrec plan` plans and what
training plans at start-up when it is given no plan file, so that both make the same plan; the
topology `shardrec plan --topology` names for the job; and the row budgets `shardrec plan` proposes
for managed tables within the memory the plan leaves, with the job file lines that set them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.dataloader.format.manifest import POOLING_STAT, Manifest
from shardrec.embeddings.dims import DEFAULT_TABLE, job_tables
from shardrec.embeddings.managed.map_memory import (
    id_map_bytes,
    id_map_floor_bytes,
    id_map_slot_bytes,
)
from shardrec.embeddings.managed.row_budget import CountCurve, Proposal, propose_rows
from shardrec.embeddings.managed.table_kinds import RAW_KINDS, TableSettings
from shardrec.embeddings.sparse_optimizers import state_bytes
from shardrec.sharding.machine.hardware import detect_topology
from shardrec.sharding.machine.memory import DenseFootprint
from shardrec.sharding.machine.topology import ClusterTopology, build_topology
from shardrec.sharding.plan.plan_types import PlanFile
from shardrec.sharding.search.request import DatasetStatistics, PlanRequest
from shardrec.trainer.job.sections import OptimConfig, ShardingConfig, TrainConfig
from shardrec.trainer.job.toml_values import toml_key, toml_value


def plan_request(
    configs: list[EmbeddingBagConfig],
    statistics: DatasetStatistics,
    *,
    train: TrainConfig,
    sharding: ShardingConfig,
    optim: OptimConfig,
    world_size: int,
    local_world_size: int,
    device_kind: str,
    topology: ClusterTopology | None = None,
    dense: DenseFootprint | None = None,
    sharding_group_size: int = 0,
    sync_every: int = 1,
    tables: Mapping[str, TableSettings] | None = None,
    stretch_steps: int = 0,
) -> PlanRequest:
    """The PlanRequest of a job's tables for `world_size` ranks: its global batch, constraints,
    compute kernel and sparse optimizer, and the dense layers' footprint
    (sharding.memory.dense_footprint) that every rank holds; the rest (topology, 2D) is the
    planner's own choice. `tables` (the job's `[tables.FEATURE]`) add the managed tables' id
    maps to every rank's memory, sized for updates every `evict_every` steps (or 1/50 of
    `stretch_steps`, the steps of the data trained on)."""
    maps = 0
    for feature, settings in (tables or {}).items():
        window = _ids_per_window(feature, settings, statistics, train, world_size, stretch_steps)
        maps += id_map_bytes(settings, window, world_size)
    dense = dataclasses.replace(dense or DenseFootprint(), id_map_bytes=maps)
    return PlanRequest(
        configs=configs,
        world_size=world_size,
        local_world_size=local_world_size,
        global_batch_size=train.global_batch_size,
        device_kind=device_kind,
        constraints=sharding.constraints,
        statistics=statistics,
        topology=topology,
        compute_kernel=sharding.compute_kernel,
        optimizer=optim.sparse,
        dense=dense,
        sharding_group_size=sharding_group_size,
        sync_every=sync_every,
    )


def _ids_per_window(
    feature: str,
    settings: TableSettings,
    statistics: DatasetStatistics,
    train: TrainConfig,
    world_size: int,
    stretch_steps: int,
) -> float:
    """The ids of `feature` a rank remaps between two updates of its map: its local batch x the
    feature's ids per sample x the steps between updates."""
    pooling = float(statistics.stats.get(feature, {}).get(POOLING_STAT, 1.0))
    return train.global_batch_size / world_size * pooling * settings.cadence(stretch_steps)


def plan_topology(
    name: str,
    world_size: int,
    local_world_size: int,
    memory_gib: float,
    profile: Path | None,
    job_device: str,
) -> ClusterTopology:
    """The topology `--topology` names; auto: where the job will train, train.device (a job set to
    cpu plans for cpu-gloo; else this machine's CUDA devices if any,
    sharding.hardware.detect_topology)."""
    memory = int(memory_gib * 2**30) if memory_gib else None
    if name == "auto" and job_device == "cpu":
        name = "cpu-gloo"
    if name != "auto":
        return build_topology(name, world_size, local_world_size or None, memory, profile)
    topo = detect_topology(world_size, local_world_size or None, profile)
    return dataclasses.replace(topo, memory_bytes=memory, memory_source="user") if memory else topo


def propose_row_budgets(
    plan: PlanFile,
    configs: list[EmbeddingBagConfig],
    statistics: DatasetStatistics,
    tables: Mapping[str, TableSettings],
    optimizer: str,
    train: TrainConfig,
    stretch_steps: int,
) -> list[Proposal]:
    """Each managed table's row budget from the data's distinct-id curve (row_budget.py), within
    the memory `plan` leaves free on its ranks plus what the tables' current budgets take; the
    curves are the manifest's count-of-counts of each raw-id feature (none: no proposal).
    `train`, `stretch_steps`: as plan_request had them (the maps' ids missed between updates)."""
    world = plan.fingerprint.world_size
    # On CPU the maps share the ranks' one memory; on CUDA they are host memory, not HBM.
    replicas = world if plan.fingerprint.device_kind == "cpu" else 0
    by_feature = {c.feature_names[0]: c for c in configs}
    curves, admit, per_row, current = {}, {}, {}, 0.0
    for feature, settings in tables.items():
        counts = statistics.stats.get(feature, {}).get("count_of_counts")
        if settings.kind != "managed" or not counts or feature not in by_feature:
            continue
        dim = by_feature[feature].embedding_dim
        device = dim * 4 + state_bytes(optimizer, 1, dim)
        # A slot is priced at most what it can cost, whatever rows the job gives now (none: 1, a
        # placeholder), so that the proposal does not depend on them and fits when pasted.
        window = _ids_per_window(feature, settings, statistics, train, world, stretch_steps)
        floor = id_map_floor_bytes(settings, window, world)
        curves[feature] = CountCurve.from_stats(counts)
        admit[feature] = settings.admit
        per_row[feature] = device + replicas * id_map_slot_bytes(settings)
        current += settings.rows * device + replicas * (
            id_map_bytes(settings, window, world) - floor
        )
    if not curves:
        return []
    est = plan.estimate
    free = (
        sum(max(0, est.memory_capacity_bytes - r.memory_bytes) for r in est.ranks)
        if est is not None
        else 0
    )
    return propose_rows(curves, admit, per_row, free + current)


def one_slot_where_unset(
    manifest: Manifest, tables: Mapping[str, TableSettings]
) -> tuple[dict[str, TableSettings], list[str]]:
    """The job's `[tables]` with one slot in each raw-id table that gives no rows (a job may leave
    them to `shardrec plan`, which needs a plan to propose them), and the keys, as the job file
    spells them, of those that apply to a feature of `manifest`."""
    used = {DEFAULT_TABLE if f not in tables else f for f in job_tables(manifest, tables)}
    unset = [f for f, s in tables.items() if s.kind in RAW_KINDS and not s.rows]
    filled = {f: dataclasses.replace(s, rows=1) if f in unset else s for f, s in tables.items()}
    return filled, [f"tables.{toml_key(f)}" for f in unset if f in used]


def budget_lines(budgets: list[Proposal], tables: Mapping[str, TableSettings]) -> str:
    """A `[tables]` section of one inline table per managed table: its settings as the job gives
    them (what differs from the defaults, kind and rows always), the proposed rows in place."""
    defaults = dataclasses.asdict(TableSettings())
    lines = ["[tables]"]
    for b in budgets:
        settings = dataclasses.asdict(dataclasses.replace(tables[b.feature], rows=b.rows))
        shown = {k: v for k, v in settings.items() if k in ("kind", "rows") or v != defaults[k]}
        items = ", ".join(f"{k} = {toml_value(v)}" for k, v in shown.items())
        lines.append(f"{toml_key(b.feature)} = {{ {items} }}")
    return "\n".join(lines)
