"""The embedding tables' optimizer state as one checkpoint part
(trainer.rundir.checkpoint.parts.ShardedPart).

DCP reshards rows freely, but row-wise Adagrad keeps one accumulator per row of each column
shard, so a resume that cuts a table into other column shards converts that state
(shardrec.embeddings.optim_layouts) from the checkpoint's plan into this job's. Element-wise
state (Adam's moments, plain Adagrad's sum) has the weights' [rows, dim] shape and DCP reshards
it as it does the weights, so it is never converted. fbgemm's step counters (Adam's bias
correction: shardrec.embeddings.table_batches) are kept per table beside the state, under
`step_counters`, as plain tensors every rank reads whole.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed._shard.sharded_tensor import ShardedTensor

from shardrec.embeddings.optim_layouts import convert_rowwise_momentum, rowwise_state_key
from shardrec.embeddings.table_batches import (
    read_step_counters,
    restore_step_counters,
    table_batches,
)
from shardrec.sharding.plan.plan_types import PlanFile, TablePlan

if TYPE_CHECKING:
    from shardrec.trainer.model.train_optimizer import TrainOptimizer
    from shardrec.trainer.rundir.checkpoint.parts import SavedCheckpoint

logger = logging.getLogger(__name__)

PART = "fused_optim"
"""The part's key in a checkpoint's DCP files (trainer.loop.train_job names the parts)."""
STEP_COUNTERS = "step_counters"


def column_widths(table: TablePlan) -> list[int]:
    """Widths of a table's column shards, left to right ([dim] when it is not cut by columns)."""
    cuts = sorted({(s.col_offset, s.cols) for s in table.shards})
    return [cols for _, cols in cuts]


def changed_cuts(saved_plan_json: str, plan: PlanFile) -> dict[str, tuple[list[int], list[int]]]:
    """Tables whose column cut differs between the checkpoint's plan and this one: name -> (old
    widths, new widths). Every rank derives the same answer from the two plans."""
    saved = {t.name: t for t in PlanFile.from_json(saved_plan_json).tables}
    cuts = {}
    for table in plan.tables:
        if table.name in saved:
            old_w, new_w = column_widths(saved[table.name]), column_widths(table)
            if old_w != new_w:
                cuts[table.name] = (old_w, new_w)
    return cuts


def adapt_fused_state(
    path: Path,
    fused_state: dict[str, Any],
    saved_plan_json: str,
    plan: PlanFile,
    group: dist.ProcessGroup | None = None,
) -> dict[str, Any]:
    """Load, from the checkpoint at `path`, every row-wise momentum whose column cut changed,
    convert it into this plan's layout and drop it from `fused_state` for the DCP load.

    Values are ShardedTensors (sharded tables) or plain tensors (data-parallel tables, every rank
    holding the whole [rows] accumulator); both are filled in place. Element-wise state (Adam's
    moments, Adagrad's) has the weights' shape and DCP reshards it as it does the weights: it is
    left alone. Where any cut changed, every rank calls the one DCP load, on `group` (the
    checkpoint's gloo group and timeout), holding such a table or not: DCP's load is a collective.
    Returns the converted entries, {param key: {state name: tensor}}, to put back after DCP loaded
    the rest.
    """
    cuts = changed_cuts(saved_plan_json, plan)
    if not cuts:
        return {}
    rows_of = {t.name: t.rows for t in plan.fingerprint.tables}
    wanted: dict[str, dict[str, torch.Tensor]] = {}
    for key, entries in fused_state.get("state", {}).items():
        for name, value in entries.items():
            table = name.rsplit(".", 1)[0]
            if (
                name != rowwise_state_key(table)
                or table not in cuts
                or not isinstance(value, torch.Tensor)
            ):
                continue
            (old_w, new_w), rows = cuts[table], rows_of[table]
            if value.dim() != 1 or value.size(0) != len(new_w) * rows:
                continue  # element-wise: [rows, dim] like the weights
            wanted.setdefault(key, {})[name] = torch.empty(len(old_w) * rows)
    full = {PART: {"state": wanted}}
    dcp.load(full, checkpoint_id=str(path), process_group=group)
    converted: dict[str, dict[str, Any]] = {}
    for key, names in full[PART]["state"].items():
        for name, old in names.items():
            table = name.rsplit(".", 1)[0]
            (old_w, new_w), rows = cuts[table], rows_of[table]
            _fill(
                fused_state["state"][key][name], convert_rowwise_momentum(old, rows, old_w, new_w)
            )
            converted.setdefault(key, {})[name] = fused_state["state"][key].pop(name)
            logger.info(
                "%s: row-wise Adagrad state converted from column cut %s to %s", table, old_w, new_w
            )
    for key in converted:  # DCP would take an emptied entry for a value of its own
        if not fused_state["state"][key]:
            del fused_state["state"][key]
    return converted


def _fill(value: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's part of the whole state `full` into `value` (a ShardedTensor or a
    replica)."""
    if not isinstance(value, ShardedTensor):
        value.copy_(full.view_as(value))
        return
    for shard in value.local_shards():
        start = shard.metadata.shard_offsets[0]
        shard.tensor.copy_(full[start : start + shard.tensor.numel()].view_as(shard.tensor))


def saved_step_counter_tables(path: Path) -> list[str]:
    """The tables whose step counters the checkpoint at `path` holds ([] for one written before
    shardrec kept them). Reads DCP's metadata: call it after the checkpoint's digests were
    verified."""
    prefix = f"{PART}.{STEP_COUNTERS}."
    keys = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    return sorted(k[len(prefix) :] for k in keys if k.startswith(prefix))


class SparseOptimizerState:
    """The embedding tables' optimizer state as one sharded checkpoint part: the fused optimizers'
    state plus the data-parallel tables' row-wise Adagrad state, all keyed by parameter FQN and
    fbgemm's state names, so either reshards into the other, and fbgemm's step counters by table.

    Args:
        fused: the sharded model's `fused_optimizer` (torchrec's KeyedOptimizer).
        optimizer: the train loop's optimizer (it holds the data-parallel tables' state).
        plan: the plan this job runs; a checkpoint of another column cut is converted into it.
    """

    def __init__(
        self,
        fused: Any,
        optimizer: TrainOptimizer,
        plan: PlanFile,
    ) -> None:
        self.fused = fused
        self.optimizer = optimizer
        self.plan = plan
        self.batches = table_batches(fused)
        self._target: dict[str, Any] = {}
        self._converted: dict[str, dict[str, Any]] = {}

    def state_dict(self) -> dict[str, Any]:
        state = self.fused.state_dict()
        out = {**state, "state": {**state["state"], **self.optimizer.replicated_state()}}
        counters = read_step_counters(self.batches)
        return {**out, STEP_COUNTERS: counters} if counters else out

    def load_target(self, saved: SavedCheckpoint) -> dict[str, Any]:
        self._target = self.state_dict()
        self._target.pop(STEP_COUNTERS, None)
        # Every table's count, not only this rank's: a table with none of its own takes the
        # largest (shardrec.embeddings.table_batches).
        tables = saved_step_counter_tables(saved.path) if self.batches else []
        if tables:
            self._target[STEP_COUNTERS] = {t: torch.zeros(1, dtype=torch.int64) for t in tables}
        self._converted = adapt_fused_state(
            saved.path, self._target, saved.layout, self.plan, saved.group
        )
        # Without any state (sgd: each table's entry is empty; no fused table) DCP saved none of
        # it, and a target holding its empty entries asks for a key that was never written: then
        # only the step counters (if any) are read.
        if any(entries for entries in self._target["state"].values()):
            return self._target
        return {STEP_COUNTERS: self._target[STEP_COUNTERS]} if tables else {}

    def finish_load(self, saved: SavedCheckpoint) -> None:
        state = self._target
        counters = state.pop(STEP_COUNTERS, None)
        for key, entries in self._converted.items():
            state["state"].setdefault(key, {}).update(entries)
        replicated = self.optimizer.replicated_state()
        for fqn, entries in replicated.items():  # loaded in place; copy in case DCP replaced them
            for name, tensor in entries.items():
                tensor.copy_(state["state"][fqn][name])
        fused = {k: v for k, v in state["state"].items() if k not in replicated}
        self.fused.load_state_dict({**state, "state": fused})
        self.optimizer.set_replicated_steps(saved.step)
        self._restore_counters(counters, saved.step)
        self._target, self._converted = {}, {}

    def _restore_counters(self, counters: dict[str, torch.Tensor] | None, step: int) -> None:
        if not self.batches:
            return
        if counters:
            restore_step_counters(self.batches, {t: int(c.item()) for t, c in counters.items()})
            return
        # A checkpoint from before shardrec kept the counters: the trainer keeps them at the
        # number of optimizer steps, which is the checkpoint's step.
        logger.info("checkpoint of step %d holds no step counters: set to %d", step, step)
        restore_step_counters(self.batches, {"": step})
