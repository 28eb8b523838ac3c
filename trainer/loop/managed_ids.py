"""A job's raw-id tables on one rank: raw ids -> rows in each batch, the id maps' updates, and
the rows they reassign started afresh before the step that first uses them.

The batches a step trains pass through `train_batches`, which remaps each one's raw-id features
with the maps as they are and counts what it remapped as seen at that batch's step. Before the
batch of an update step is remapped, every rank combines its statistics with the others'
(embeddings.managed.map_reduce, on the job's own gloo group) and applies the same update, so the
maps stay replicas. The rows an update reassigned are reset (embeddings.managed.row_reset) just
before that step's forward (`before_step`): torchrec's pipeline may remap a batch while an earlier
one still trains, and those earlier steps must train the rows' old owners.

Statistics are counted when a batch is remapped, not after it trained: every remapped batch is
trained (a segment's pipeline runs every batch it pulled), so at a checkpoint the two are the
same, and a batch's statistics never wait on the pipeline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torchrec.datasets.utils import Batch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shardrec.embeddings.managed.map_reduce import combine_over_ranks
from shardrec.embeddings.managed.map_update import UpdateResult
from shardrec.embeddings.managed.maps import ManagedMaps, build_maps
from shardrec.embeddings.managed.row_reset import RowResets, reset_rows
from shardrec.embeddings.managed.table_kinds import RAW_KINDS, TableSettings
from shardrec.embeddings.tables import is_unpooled, table_name, table_weight_fqn
from shardrec.trainer.model.train_optimizer import TrainOptimizer

logger = logging.getLogger(__name__)


@dataclass
class StretchCounts:
    """What the maps did in the current stretch, per feature (metrics)."""

    hits: dict[str, int] = field(default_factory=dict)
    misses: dict[str, int] = field(default_factory=dict)
    admitted: dict[str, int] = field(default_factory=dict)
    evicted: dict[str, int] = field(default_factory=dict)

    def add(self, feature: str, result: UpdateResult, lookups: bool = True) -> None:
        """Count an update; `lookups` False: not its window's lookups (counted before)."""
        for name in (
            ("hits", "misses", "admitted", "evicted") if lookups else ("admitted", "evicted")
        ):
            counts = getattr(self, name)
            counts[feature] = counts.get(feature, 0) + int(getattr(result, name))

    def state_dict(self) -> dict[str, Any]:
        return {
            name: dict(getattr(self, name)) for name in ("hits", "misses", "admitted", "evicted")
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("hits", "misses", "admitted", "evicted"):
            setattr(self, name, {k: int(v) for k, v in state.get(name, {}).items()})

    def clear(self) -> None:
        self.load_state_dict({})

    def summary(self, hits: int = 0, misses: int = 0) -> dict[str, Any]:
        """Totals over the features and the shared row's share of the lookups counted, with
        `hits` and `misses` not yet counted (those since the last update)."""
        hits, misses = hits + sum(self.hits.values()), misses + sum(self.misses.values())
        return {
            "admitted": sum(self.admitted.values()),
            "evicted": sum(self.evicted.values()),
            "shared_row_share": round(misses / (hits + misses), 6) if hits + misses else 0.0,
        }


def remap_batch(maps: ManagedMaps, batch: Batch, step: int | None) -> Batch:
    """`batch` with its raw-id features' values replaced by table rows (maps.rows); counted as
    seen at `step` (None: read only: evaluation, prediction). Padding rows (label < 0) are never
    counted."""
    kjt = batch.sparse_features
    offsets = kjt.offset_per_key()
    values = kjt.values().numpy().copy()
    real = (batch.labels >= 0).numpy() if step is not None else None
    lengths = kjt.lengths().numpy().reshape(len(kjt.keys()), -1) if real is not None else None
    for i, key in enumerate(kjt.keys()):
        if key not in maps.tables:
            continue
        lo, hi = offsets[i], offsets[i + 1]
        counted = None
        if real is not None and lengths is not None:
            counted = np.repeat(real, lengths[i])  # each id of a row counts as its row does
        keys = values[lo:hi].view(np.uint64)
        values[lo:hi] = maps.rows(key, keys, counted, step if step is not None else 0)
    remapped = KeyedJaggedTensor(
        keys=kjt.keys(),
        values=torch.from_numpy(values),
        lengths=kjt.lengths(),
        stride=kjt.stride(),
        length_per_key=kjt.length_per_key(),
        offset_per_key=offsets,
    )
    return Batch(dense_features=batch.dense_features, sparse_features=remapped, labels=batch.labels)


class ManagedIds:
    """Runs a job's ManagedMaps over this rank's batches.

    Args:
        maps: the job's raw-id tables.
        tables: the model's tables, in order (their positions number the reinit's draws).
        model: the (sharded) model; its tables' rows are reset in place.
        ebc_path: where its EmbeddingBagCollection sits.
        ec_path: where a sequence model's EmbeddingCollection sits (its unpooled tables).
        seed: the job's seed.
        group: a gloo group of every rank for the maps' collectives (None: one rank).
        optimizer_states: returns (the fused optimizer's state, the data-parallel tables' state)
            at reset time.
    """

    def __init__(
        self,
        maps: ManagedMaps,
        tables: list[EmbeddingBagConfig],
        model: torch.nn.Module,
        *,
        ebc_path: str,
        ec_path: str = "",
        seed: int,
        group: dist.ProcessGroup | None,
        optimizer_states: Callable[[], tuple[Any, Any]] = lambda: (None, None),
    ) -> None:
        self.maps = maps
        self.model = model
        self.seed = seed
        self.group = group
        self.optimizer_states = optimizer_states
        self.counts = StretchCounts()
        self._tables = {t.feature_names[0]: (i, t) for i, t in enumerate(tables)}
        self._ebc_path = ebc_path
        self._ec_path = ec_path
        self._resets: dict[int, list[RowResets]] = {}

    # --- batches ------------------------------------------------------------------------------

    def train_batches(self, batches: Iterator[Batch], first_step: int) -> Iterator[Batch]:
        """`batches` remapped, the first at step `first_step` (0-based), each counted; the maps
        update before every due step."""
        step = first_step
        for batch in batches:
            due = self.maps.due(step)
            if due:
                self.update(step)
            yield self.remap(batch, step)
            step += 1

    def eval_batches(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """`batches` remapped read only (nothing counted)."""
        for batch in batches:
            yield self.remap(batch, None)

    def remap(self, batch: Batch, step: int | None) -> Batch:
        """The batch with its raw-id features' values replaced by table rows; counted as seen at
        `step` (None: not counted)."""
        return remap_batch(self.maps, batch, step)

    # --- updates and resets -------------------------------------------------------------------

    def update(self, step: int) -> None:
        """Update every due table's map at `step` with every rank's statistics; the reassigned
        rows are reset before that step's forward."""
        due = self.maps.due(step)
        combined = combine_over_ranks([t.idmap.pending() for t in due], self.group)  # type: ignore[union-attr]
        # A stretch's first update applies the lookups of the stretch before's last steps: they
        # are that stretch's, counted at its end (stretch_figures).
        own_window = step != self.maps.stretches.start
        resets = []
        for table, pending in zip(due, combined):
            result = self.maps.update(table, pending, step)
            self.counts.add(table.feature, result, lookups=own_window)
            if len(result.reassigned):
                index, config = self._tables[table.feature]
                rows = result.reassigned + (config.num_embeddings - table.settings.rows)
                resets.append(
                    RowResets(
                        self.weight_fqn(config),
                        index,
                        config.num_embeddings,
                        rows,
                        np.full(len(rows), step, np.int64),
                    )
                )
        if resets:
            self._resets[step] = resets

    def stretch_figures(self) -> dict[str, Any]:
        """What the maps did in the current stretch so far (StretchCounts.summary), its lookups
        since the last update included. Collective: every rank calls it (each counted its own
        lookups; a resumed rank 0 holds the checkpoint's)."""
        totals = torch.tensor(
            [
                [int(t.idmap.hits.sum()), int(t.idmap.pending_misses())]  # type: ignore[union-attr]
                for t in self.maps.mapped
            ],
            dtype=torch.int64,
        ).reshape(-1, 2)
        if self.group is not None and dist.get_world_size(self.group) > 1:
            dist.all_reduce(totals, op=dist.ReduceOp.SUM, group=self.group)
        hits, misses = (int(v) for v in totals.sum(dim=0))
        return self.counts.summary(hits, misses)

    def weight_fqn(self, config: EmbeddingBagConfig) -> str:
        """The weight of a table of the model: in its EmbeddingCollection where it is unpooled."""
        if is_unpooled(config):
            return table_weight_fqn(self._ec_path, config.name, unpooled=True)
        return table_weight_fqn(self._ebc_path, config.name)

    def before_step(self, step: int) -> None:
        """Reset the rows an update at `step` reassigned (call before that step's forward)."""
        resets = self._resets.pop(step, None)
        if resets:
            fused, replicated = self.optimizer_states()
            reset_rows(
                self.model, resets, self.seed, fused_state=fused, replicated_state=replicated
            )

    def pending_resets(self) -> bool:
        return bool(self._resets)


def check_managed_kernels(
    table_settings: Mapping[str, TableSettings], kernels: Mapping[str, str]
) -> None:
    """Refuse a managed table the plan puts in host memory behind an HBM cache (CUDA's
    fused_uvm_caching): a reset row would stay stale in the cache. `kernels`: table name ->
    compute kernel."""
    for feature, settings in table_settings.items():
        kernel = kernels.get(table_name(feature), "fused")
        if settings.kind in ("managed", "unbounded") and kernel.startswith("fused_uvm_caching"):
            raise ValueError(
                f"tables.{feature}: the plan puts this {settings.kind} table on {kernel}, behind an "
                "HBM cache that its row resets would leave stale; plan it on the fused kernel "
                f'(sharding.constraints.t_{feature} = {{ compute_kernels = ["fused"] }}) or lower '
                f"tables.{feature}.rows"
            )


def build_managed_ids(
    table_settings: Mapping[str, TableSettings],
    tables: list[EmbeddingBagConfig],
    model: Any,
    optimizer: TrainOptimizer | None,
    *,
    ebc_path: str,
    ec_path: str = "",
    seed: int,
    stretch_steps: int,
    timeout_s: float,
) -> ManagedIds | None:
    """The job's raw-id tables on this rank (None: the job has none); `optimizer` None: read only
    (evaluation). Collective where a process group exists: every rank makes the maps' gloo group."""
    raw = {
        t.feature_names[0]: (t.name, table_settings[t.feature_names[0]])
        for t in tables
        if t.feature_names[0] in table_settings
        and table_settings[t.feature_names[0]].kind in RAW_KINDS
    }
    if not raw:
        return None
    maps = build_maps(raw)
    maps.begin_stretch(0, stretch_steps)
    group = (
        dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        if dist.is_initialized()
        else None
    )

    def optimizer_states() -> tuple[Any, Any]:
        fused = getattr(model, "fused_optimizer", None)
        replicated = optimizer.replicated_tables if optimizer is not None else None
        return (
            fused.state_dict()["state"] if fused is not None else None,
            replicated.state if replicated is not None else None,
        )

    return ManagedIds(
        maps,
        tables,
        model,
        ebc_path=ebc_path,
        ec_path=ec_path,
        seed=seed,
        group=group,
        optimizer_states=optimizer_states,
    )
