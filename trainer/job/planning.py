"""The one conversion of a job into the planner's request: what `shardrec plan` plans and what
training plans at start-up when it is given no plan file, so that both make the same plan; the
topology `shardrec plan --topology` names for the job; and the row budgets `shardrec plan` proposes
for managed tables within the memory the plan leaves, with the job file lines that set them."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
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
from shardrec.sharding.plan.plan_types import PlanDoesNotFitError, PlanFile
from shardrec.sharding.planner import plan_tables
from shardrec.sharding.search.request import DatasetStatistics, PlanRequest
from shardrec.trainer.job.sections import OptimConfig, ShardingConfig, TrainConfig
from shardrec.trainer.job.toml_values import toml_key, toml_value

logger = logging.getLogger(__name__)


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
    maps = _id_maps_bytes(tables or {}, statistics, train, world_size, stretch_steps)
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


def _id_maps_bytes(
    tables: Mapping[str, TableSettings],
    statistics: DatasetStatistics,
    train: TrainConfig,
    world_size: int,
    stretch_steps: int,
) -> int:
    """Bytes of the managed tables' id maps on every rank."""
    maps = 0
    for feature, settings in tables.items():
        window = _ids_per_window(feature, settings, statistics, train, world_size, stretch_steps)
        maps += id_map_bytes(settings, window, world_size)
    return maps


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


FIT_TRIES = 8
"""Plans of cut proposals before `propose_row_budgets` gives up on one that fits."""
GROW_TRIES = 6
"""Plans of proposals between the last cut and the last refused before it keeps the last cut."""


def propose_row_budgets(
    request: PlanRequest,
    plan: PlanFile,
    tables: Mapping[str, TableSettings],
    train: TrainConfig,
    stretch_steps: int,
    search: str,
) -> list[Proposal]:
    """Each managed table's row budget from the data's distinct-id curve (row_budget.py), within
    the memory a plan of one slot a table leaves free on its ranks (`plan`, of `request`, where
    the job gives none); the curves are the manifest's count-of-counts of each raw-id feature
    (none: no proposal). `train`, `stretch_steps`: as plan_request had them (the maps' ids missed
    between updates).

    The proposed rows are then planned as the job file they are pasted into would plan them
    (`search`): at other rows the planner places a table otherwise (a sharded table holds id and
    pooled-output buffers that a data-parallel one does not), so where that plan is short, the
    budget is cut by the shortfall and the rows proposed again, up to FIT_TRIES plans; then grown
    back by halves towards the budget refused, up to GROW_TRIES plans."""
    features = _with_curves(request, tables)
    if not features:
        return []
    given = {f: tables[f].rows for f in features}
    one = dict.fromkeys(features, 1)
    if given != one:
        # Priced as a job without rows is, not by the rows the job gives now: a proposal does not
        # depend on them, so that pasted, the same rows are proposed again.
        plan = plan_tables(_with_rows(request, tables, one, train, stretch_steps), search=search)
    slots = {f: dataclasses.replace(tables[f], rows=1) for f in features}
    curves, admit, per_row, budget = _priced_rows(plan, request, slots, train, stretch_steps)

    def short_of(budget: float) -> tuple[list[Proposal], float, float]:
        """The proposal within `budget`, the bytes it spends and its plan's shortfall (0: fits)."""
        budgets = propose_rows(curves, admit, per_row, budget)
        rows = {b.feature: b.rows for b in budgets}
        spent = sum(b.rows * b.bytes_per_row for b in budgets)
        if rows == given:
            return budgets, spent, 0.0  # the job's own plan is of these rows
        try:
            plan_tables(_with_rows(request, tables, rows, train, stretch_steps), search=search)
        except PlanDoesNotFitError as e:
            # torchrec's planner measures no shortfall: a tenth of the rows' bytes instead.
            return budgets, spent, e.short_bytes or spent / 10
        return budgets, spent, 0.0

    return _fitted(short_of, budget)


def _fitted(
    short_of: Callable[[float], tuple[list[Proposal], float, float]], budget: float
) -> list[Proposal]:
    """The proposal within `budget`, cut by its plan's shortfall until one fits (FIT_TRIES), then
    grown back by halves towards the least budget refused (GROW_TRIES): `short_of(budget)` gives
    the proposal, the bytes it spends and its plan's shortfall (0: it fits)."""
    refused = None
    for _ in range(FIT_TRIES):
        budgets, spent, short = short_of(budget)
        if not short:
            break
        refused, budget = spent, spent - short
    else:
        logger.warning(
            "the managed tables' proposed rows did not fit in %d plans; pasted, they may be "
            "refused",
            FIT_TRIES,
        )
        return budgets
    # The cut was the shortfall of a placement of more rows: between the two, more may fit.
    for _ in range(GROW_TRIES if refused is not None else 0):
        middle = (budget + refused) / 2
        trial, _, short = short_of(middle)
        if short:
            refused = middle
        else:
            budgets, budget = trial, middle
    return budgets


def _with_curves(request: PlanRequest, tables: Mapping[str, TableSettings]) -> list[str]:
    """The managed tables' features whose ids the manifest counted (count-of-counts)."""
    named = {c.feature_names[0] for c in request.configs}
    return [
        f
        for f, s in tables.items()
        if s.kind == "managed"
        and f in named
        and request.statistics.stats.get(f, {}).get("count_of_counts")
    ]


def _priced_rows(
    plan: PlanFile,
    request: PlanRequest,
    tables: Mapping[str, TableSettings],
    train: TrainConfig,
    stretch_steps: int,
) -> tuple[dict[str, CountCurve], dict[str, int], dict[str, float], float]:
    """The id curves, admissions and bytes per row over all ranks of `tables` (managed, with
    curves), and the bytes they may spend: what `plan` leaves free plus what their rows take."""
    world = plan.fingerprint.world_size
    # On CPU the maps share the ranks' one memory; on CUDA they are host memory, not HBM.
    replicas = world if plan.fingerprint.device_kind == "cpu" else 0
    by_feature = {c.feature_names[0]: c for c in request.configs}
    curves, admit, per_row, current = {}, {}, {}, 0.0
    for feature, settings in tables.items():
        counts = request.statistics.stats[feature]["count_of_counts"]
        dim = by_feature[feature].embedding_dim
        device = dim * 4 + state_bytes(request.optimizer, 1, dim)
        # A slot is priced at most what it can cost, whatever rows the plan has (1, a
        # placeholder), so that the proposal fits when pasted.
        window = _ids_per_window(feature, settings, request.statistics, train, world, stretch_steps)
        floor = id_map_floor_bytes(settings, window, world)
        curves[feature] = CountCurve.from_stats(counts)
        admit[feature] = settings.admit
        per_row[feature] = device + replicas * id_map_slot_bytes(settings)
        current += settings.rows * device + replicas * (
            id_map_bytes(settings, window, world) - floor
        )
    est = plan.estimate
    free = (
        sum(max(0, est.memory_capacity_bytes - r.memory_bytes) for r in est.ranks)
        if est is not None
        else 0
    )
    return curves, admit, per_row, free + current


def _with_rows(
    request: PlanRequest,
    tables: Mapping[str, TableSettings],
    rows: Mapping[str, int],
    train: TrainConfig,
    stretch_steps: int,
) -> PlanRequest:
    """`request` as the job would make it with `rows` slots in those features' tables: their
    tables' rows and their id maps."""
    resized = {f: dataclasses.replace(s, rows=rows.get(f, s.rows)) for f, s in tables.items()}
    configs = [
        dataclasses.replace(c, num_embeddings=resized[c.feature_names[0]].table_rows)
        if c.feature_names[0] in rows
        else c
        for c in request.configs
    ]
    maps = _id_maps_bytes(resized, request.statistics, train, request.world_size, stretch_steps)
    dense = dataclasses.replace(request.dense, id_map_bytes=maps)
    return dataclasses.replace(request, configs=configs, dense=dense)


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
