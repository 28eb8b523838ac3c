"""Steps: one training step (through torchrec's pipeline or a plain loop), the global loss
reduced across ranks between reports, and evaluation steps over a split.

The loop that decides how many steps run between evaluations and checkpoints is train_loop.py.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torchrec.datasets.utils import Batch
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

from shardrec.trainer.loop.metrics import binary_metrics
from shardrec.trainer.model.train_optimizer import TrainOptimizer

logger = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; training stops without saving the bad weights."""


@dataclass
class StepStats:
    """The global training loss over the steps since the previous report."""

    step: int
    loss: float
    samples: int
    steps: int
    stop: bool = False
    """Some rank was asked to stop (trainer.distributed.stop): every rank gets the same answer."""


def non_finite_cause(stage: str) -> tuple[str, str]:
    """(where a NaN loss that began at `stage` began, what to do); stage: one of
    models.finite_stages, "" when unknown."""
    if stage.startswith("the dense input"):
        return (
            f"first in {stage}: the data holds NaN or infinity",
            "remake the dataset from finite values (`shardrec data stats DATA` shows each dense "
            "column's range)",
        )
    if stage.startswith("the embeddings"):
        return f"first in {stage}, from finite inputs", "lower optim.sparse_lr?"
    if stage:
        return f"first in {stage}, from finite inputs", "lower optim.dense_lr?"
    return "", "lower the learning rates?"


class LossWindow:
    """Per-rank sums since the last report; reduced over ranks only at reports, because a
    collective every step costs a sync point per step (measured ~8% of a demo step on CPU)."""

    first_step: int
    losses: list[torch.Tensor]
    samples: list[torch.Tensor]
    finite: list[torch.Tensor | None]

    def __init__(self, first_step: int, stages: list[str] | None = None) -> None:
        self.stages = list(stages or [])
        """What each step's `finite` flags are about (models.finite_stages)."""
        self.reset(first_step)

    def reset(self, first_step: int) -> None:
        """Empty the window; it then holds steps first_step + 1, first_step + 2, ..."""
        self.first_step = first_step
        self.losses = []
        self.samples = []
        self.finite = []

    @property
    def steps(self) -> int:
        return len(self.losses)

    def add(
        self, loss_sum: torch.Tensor, samples: torch.Tensor, finite: torch.Tensor | None = None
    ) -> None:
        # Only references here: no per-step arithmetic, and no .item() (a sync per step on CUDA).
        self.losses.append(loss_sum)
        self.samples.append(samples)
        self.finite.append(finite)

    def _first_bad_stage(self, step_index: int) -> int:
        """Index into `stages` of the first stage that was not finite at that step (-1: none)."""
        flags = self.finite[step_index]
        if flags is None or len(flags) != len(self.stages):
            return -1
        bad = (~flags.bool()).nonzero()
        return int(bad[0, 0]) if bad.numel() else -1

    def report(self, step: int, stop_requested: bool = False) -> StepStats:
        """All ranks together: raise NonFiniteLossError if any rank saw NaN/inf, else the stats,
        which say whether any rank had `stop_requested`."""
        losses = torch.stack(self.losses).double()
        bad = (~torch.isfinite(losses)).nonzero()
        first_bad = float(self.first_step + 1 + bad[0, 0]) if bad.numel() else 0.0
        stage = float(self._first_bad_stage(int(bad[0, 0]))) if bad.numel() else -1.0
        mine = torch.stack(
            [
                losses.nan_to_num(0.0, 0.0, 0.0).sum(),
                torch.stack(self.samples).double().sum(),
                torch.tensor(first_bad, dtype=torch.float64, device=losses.device),
                torch.tensor(float(stop_requested), dtype=torch.float64, device=losses.device),
                torch.tensor(stage, dtype=torch.float64, device=losses.device),
            ]
        )
        rows = [mine]
        if dist.is_initialized() and dist.get_world_size() > 1:
            rows = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(
                rows, mine
            )  # one collective: the sums, the earliest bad step, stop requests
        table = torch.stack(rows).cpu()
        bad_steps = table[:, 2][table[:, 2] > 0]
        if bad_steps.numel():
            # The earliest bad step's rank (the lowest of those) says where it began.
            ranks = ((table[:, 2] > 0) & (table[:, 2] == bad_steps.min())).nonzero()
            stage = int(table[int(ranks[0, 0]), 4])
            where = self.stages[stage] if 0 <= stage < len(self.stages) else ""
            cause, todo = non_finite_cause(where)
            raise NonFiniteLossError(
                f"step {int(bad_steps.min())}: the loss is NaN or infinite on {bad_steps.numel()} "
                f"rank(s){f', {cause}' if cause else ''}; stopped without saving (the last "
                f"checkpoint is the last good state); {todo}"
            )
        loss, samples = float(table[:, 0].sum()), float(table[:, 1].sum())
        stats = StepStats(
            step, loss / max(samples, 1.0), int(samples), self.steps, bool(table[:, 3].any())
        )
        self.reset(step)
        return stats


class StepRunner:
    """Runs steps with torchrec's TrainPipelineSparseDist (overlapping input distribution with
    compute) or a plain forward/backward/step loop; the arithmetic is the same."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: TrainOptimizer,
        device: torch.device,
        pipeline: str,
        stages: list[str] | None = None,
    ) -> None:
        self.model = model
        self.stages = list(stages or [])
        """What each step's finite flags are about (models.finite_stages), for LossWindow."""
        self.optimizer = optimizer
        self.device = device
        self.pipeline = None
        if pipeline == "auto":
            # On CPU the ranks share the cores that would overlap communication with compute:
            # the pipeline measured ~5-10% slower there (shardrec bench train).
            pipeline = "sparse_dist" if device.type == "cuda" else "plain"
        if pipeline == "sparse_dist":
            self.pipeline = TrainPipelineSparseDist(
                model, optimizer, device, execute_all_batches=True
            )  # type: ignore[arg-type]
        self.steps_by: dict[str, int] = {}
        """Steps taken, by what took them: the pipeline's class name, or "plain"."""

    def run(
        self, batches: Iterator[Batch], before_step: Callable[[int], None] | None = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Train on every batch of `batches`; yields (loss_sum, real samples, finite flags of
        each stage: models.finite_stages) of this rank per step. `before_step(i)` runs before the
        i-th step's forward (0-based), after every earlier step's backward and optimizer step: the
        pipeline may have pulled step i's batch earlier."""
        self.model.train()
        if self.pipeline is not None:
            # The pipeline pulls the first batches inside its first step: pull the first here, so
            # that whatever pulling it does for step 0 (an id map update's row resets) is done
            # before before_step(0), as for every later step.
            first = next(batches, None)
            if first is None:
                return
            batches = itertools.chain((first,), batches)
            i = 0
            while True:
                if before_step is not None:
                    before_step(i)
                try:
                    loss_sum, _, labels, finite = self.pipeline.progress(batches)
                except StopIteration:
                    return
                i += 1
                name = type(self.pipeline).__name__
                self.steps_by[name] = self.steps_by.get(name, 0) + 1
                yield loss_sum, (labels >= 0).sum(), finite
        else:
            for i, batch in enumerate(batches):
                if before_step is not None:
                    before_step(i)
                if self.device.type != "cpu":
                    batch = batch.to(self.device, non_blocking=True)
                self.optimizer.zero_grad()
                loss, (loss_sum, _, labels, finite) = self.model(batch)
                loss.backward()
                self.optimizer.step()
                self.steps_by["plain"] = self.steps_by.get("plain", 0) + 1
                yield loss_sum, (labels >= 0).sum(), finite

    def eval_mode(self) -> torch.nn.Module:
        """The model with its original (unpipelined) forward, for evaluation between segments."""
        if self.pipeline is not None:
            self.pipeline.detach()
        self.model.eval()
        return self.model


@torch.no_grad()
def evaluate_batches(
    model: torch.nn.Module,
    batches: Iterator[Batch],
    device: torch.device,
    max_batches: int = 0,
    on_batch: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """AUC / log loss / NE over every rank's predictions (all ranks must pass equal batch counts);
    `on_batch` gets the number of batches done after each (a progress bar)."""
    logits, labels = [], []
    for i, batch in enumerate(batches):
        if max_batches and i >= max_batches:
            break
        _, (_, batch_logits, batch_labels, _) = model(batch.to(device))
        # Kept on the device: gathered there (NCCL) and scored there, with no sync per batch.
        logits.append(batch_logits.float())
        labels.append(batch_labels.float())
        if on_batch is not None:
            on_batch(i + 1)
    local = (
        torch.stack([torch.cat(logits), torch.cat(labels)])
        if logits
        else torch.zeros(2, 0, device=device)
    )
    if dist.is_initialized() and dist.get_world_size() > 1:
        gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, local)
        local = torch.cat(gathered, dim=1)
    return binary_metrics(local[0], local[1])
