"""The after-backward optimizer (dense layers and data-parallel tables) and the LR schedule.

The sparse optimizer (its settings, fused into the tables in backward) is
shardrec.embeddings.optim's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from shardrec.embeddings.optim import optimizer_kwargs
from shardrec.embeddings.optim_layouts import rowwise_state_key

DENSE_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adagrad": torch.optim.Adagrad,
    "adam": torch.optim.Adam,
    "sgd": torch.optim.SGD,
}


FUSED = ("adagrad", "adam")
"""Dense optimizers run as torch's fused kernels (one pass over each parameter; Adagrad on the
reference model's 2.3 M dense parameters: 2.3 ms a step against 6.1 ms for the foreach path on one
CPU thread). SGD's foreach path is one pass already."""


def build_dense_optimizer(
    params: list[torch.nn.Parameter],
    *,
    optimizer: str,
    lr: float,
    eps: float,
    betas: tuple[float, float] | None = None,
) -> torch.optim.Optimizer:
    """The dense layers' optimizer, `optimizer` a key of DENSE_OPTIMIZERS; `betas` Adam's. A
    resumed checkpoint's own `fused` flag (its param_groups) wins, so a run resumes with the
    arithmetic it saved."""
    kwargs = optimizer_kwargs(optimizer, lr, eps)
    if optimizer == "adam" and betas is not None:
        kwargs["betas"] = betas
    devices = {p.device.type for p in params}
    if optimizer in FUSED and params and devices <= {"cpu", "cuda"}:
        kwargs["fused"] = True
    return DENSE_OPTIMIZERS[optimizer](params, **kwargs)


def dlrm_schedule(
    warmup_steps: int, decay_start: int, decay_steps: int, from_zero: bool = False
) -> Callable[[int], float]:
    """The DLRMv2 (MLPerf) schedule as a multiplier of the peak LR at a 0-based step:
    linear warm-up, constant, then quadratic decay to zero over `decay_steps`. `from_zero`: the
    warm-up of DLRMv4's reference, step / warmup_steps (its first step at rate 0)."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step if from_zero else step + 1) / warmup_steps
        if decay_start and decay_steps and step >= decay_start:
            left = decay_start + decay_steps - step
            return max(0.0, left / decay_steps) ** 2
        return 1.0

    return factor


class TrainOptimizer:
    """The optimizer the train loop steps after backward (the fused ones already ran).

    Holds the dense optimizer (dense layers, with the LR schedule) and, if the plan has
    data-parallel tables, their optimizer (the same algorithm as the fused one). Adagrad state
    (row-wise or full) of those tables is exposed under fbgemm's names (`replicated_state`), so a
    checkpoint stores it like a fused table's and a resume may move the table between
    data-parallel and sharded.
    """

    def __init__(
        self,
        dense: torch.optim.Optimizer,
        replicated_tables: torch.optim.Optimizer | None,
        replicated_params: dict[str, tuple[str, torch.nn.Parameter]],
        schedule: Callable[[int], float],
        fused: torch.optim.Optimizer | None = None,
        clip_grad_norm: float = 0.0,
    ) -> None:
        self.dense = dense
        self.clip_grad_norm = clip_grad_norm
        """Global norm the dense layers' gradient is clipped to before their step (0: none)."""
        self.replicated_tables = replicated_tables
        self.replicated_params = replicated_params
        """Parameter FQN -> (table name, parameter) of the data-parallel tables."""
        self.scheduler = LambdaLR(dense, schedule)
        self.schedule = schedule
        self.stepped_lr = dense.param_groups[0]["lr"]
        """The dense layers' rate in the last step taken (metrics.jsonl's `lr` of that step);
        after a step their param_groups already hold the next step's."""
        tables = (fused, replicated_tables) if fused is not None else ()
        self.scheduled_tables = [o for o in tables if o is not None]
        """The tables' optimizers when the schedule applies to them too (the DLRMv2 reference's
        CombinedOptimizer); `fused` is the sharded model's fused_optimizer."""
        self._table_lrs = [[g["lr"] for g in o.param_groups] for o in self.scheduled_tables]

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [o for o in (self.dense, self.replicated_tables) if o is not None]

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [g for o in self.optimizers for g in o.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)
        self._schedule_tables()

    def _schedule_tables(self) -> None:
        """Set the tables' LR of the coming step (the scheduler's count, restored on resume). Called
        before forward: the fused tables update in this step's backward, from the LR their kernel
        was given, which torchrec's fused optimizer passes on in zero_grad."""
        factor = self.schedule(self.scheduler.last_epoch)
        for optimizer, base in zip(self.scheduled_tables, self._table_lrs):
            for group, lr in zip(optimizer.param_groups, base):
                group["lr"] = lr * factor
            optimizer.zero_grad()

    def step(self) -> None:
        if self.clip_grad_norm:  # DDP averaged the gradients already: every rank clips alike
            params = [p for g in self.dense.param_groups for p in g["params"] if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm)
        self.stepped_lr = self.dense.param_groups[0]["lr"]
        for o in self.optimizers:
            o.step()
        self.scheduler.step()

    def _stateless(self) -> bool:
        # Plain SGD (the sparse "sgd": no momentum) keeps no state per table, so there is nothing
        # to carry between layouts: a resume may move its tables to or from data-parallel freely.
        return isinstance(self.replicated_tables, torch.optim.SGD) and all(
            not g.get("momentum") for g in self.replicated_tables.param_groups
        )

    def _state_by_name(self) -> bool:
        # Both Adagrads keep one `sum` that fbgemm calls momentum1; torch.optim.Adagrad is also full
        # Adagrad's (fused: EXACT_ADAGRAD), RowWiseAdagrad row-wise Adagrad's.
        return isinstance(self.replicated_tables, (RowWiseAdagrad, torch.optim.Adagrad))

    def replicated_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """{param FQN: {"<table>.momentum1": accumulators}} (views) for Adagrad, keyed as fbgemm
        keys a fused table's (optim_layouts.rowwise_state_key): [rows] row-wise, [rows, dim] full
        (the weights')."""
        if not self._state_by_name():
            return {}
        state = self.replicated_tables.state  # type: ignore[union-attr]
        rowwise = isinstance(self.replicated_tables, RowWiseAdagrad)
        return {
            fqn: {
                rowwise_state_key(table): state[p]["sum"].view(-1) if rowwise else state[p]["sum"]
            }
            for fqn, (table, p) in self.replicated_params.items()
        }

    def set_replicated_steps(self, step: int) -> None:
        if self._state_by_name():
            for _, p in self.replicated_params.values():
                self.replicated_tables.state[p]["step"] = torch.tensor(float(step))  # type: ignore[union-attr]

    def state_dict(self) -> dict[str, Any]:
        out = {"dense": self.dense.state_dict(), "scheduler": self.scheduler.state_dict()}
        if self.replicated_tables is not None and not self._state_by_name():
            out["replicated_tables"] = self.replicated_tables.state_dict()
            out["replicated_names"] = sorted(self.replicated_params)
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load the checkpoint's state (moments, step counts, the schedule's step) but keep this
        job's settings: torch restores a checkpoint's rates and epsilons with its param_groups,
        and a resume that accepted a change of them (`--allow-change optim.dense_lr`) would
        otherwise go on at the old ones."""
        settings = [_job_settings(o) for o in self.optimizers]
        self._load(state)
        for optimizer, groups in zip(self.optimizers, settings):
            for group, kept in zip(optimizer.param_groups, groups):
                group.update(kept)
        base = [g["initial_lr"] for g in self.dense.param_groups]
        self.scheduler.base_lrs = base
        factor = self.schedule(self.scheduler.last_epoch)
        for group, lr in zip(self.dense.param_groups, base):
            group["lr"] = lr * factor
        self.scheduler._last_lr = [g["lr"] for g in self.dense.param_groups]

    def _load(self, state: dict[str, Any]) -> None:
        self.dense.load_state_dict(state["dense"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.replicated_tables is None or self._state_by_name() or self._stateless():
            return
        if state.get("replicated_names") != sorted(self.replicated_params):
            raise ValueError(
                "the checkpoint's data-parallel tables differ from this plan's, and their "
                f"{type(self.replicated_tables).__name__} state cannot move between layouts "
                "(row-wise Adagrad, Adagrad and sgd can): resume with the checkpoint's plan"
            )
        self.replicated_tables.load_state_dict(state["replicated_tables"])


JOB_SETTINGS = ("lr", "initial_lr", "eps", "betas")
"""The param_groups' entries the job sets (optim.*), which a resume keeps from the job, not the
checkpoint. The rest (`fused`, `foreach`, ...) is arithmetic the checkpoint's run chose: kept."""


def _job_settings(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    return [{k: g[k] for k in JOB_SETTINGS if k in g} for g in optimizer.param_groups]
