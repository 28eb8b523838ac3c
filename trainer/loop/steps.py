"""Steps: one training step (through torchrec's pipeline or a plain loop), the global loss
reduced across ranks between reports, and evaluation steps over a split.

The loop that decides how many steps run between evaluations and checkpoints is train_loop.py.
"""

from __future__ import annotations

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


class LossWindow:
    """Per-rank sums since the last report; reduced over ranks only at reports, because a
    collective every step costs a sync point per step (measured ~8% of a demo step on CPU)."""

    first_step: int
    losses: list[torch.Tensor]
    samples: list[torch.Tensor]

    def __init__(self, first_step: int) -> None:
        self.reset(first_step)

    def reset(self, first_step: int) -> None:
        """Empty the window; it then holds steps first_step + 1, first_step + 2, ..."""
        self.first_step = first_step
        self.losses = []
        self.samples = []

    @property
    def steps(self) -> int:
        return len(self.losses)

    def add(self, loss_sum: torch.Tensor, samples: torch.Tensor) -> None:
        # Only references here: no per-step arithmetic, and no .item() (a sync per step on CUDA).
        self.losses.append(loss_sum)
        self.samples.append(samples)

    def report(self, step: int, stop_requested: bool = False) -> StepStats:
        """All ranks together: raise NonFiniteLossError if any rank saw NaN/inf, else the stats,
        which say whether any rank had `stop_requested`."""
        losses = torch.stack(self.losses).double()
        bad = (~torch.isfinite(losses)).nonzero()
        first_bad = float(self.first_step + 1 + bad[0, 0]) if bad.numel() else 0.0
        mine = torch.stack(
            [
                losses.nan_to_num(0.0, 0.0, 0.0).sum(),
                torch.stack(self.samples).double().sum(),
                torch.tensor(first_bad, dtype=torch.float64, device=losses.device),
                torch.tensor(float(stop_requested), dtype=torch.float64, device=losses.device),
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
            raise NonFiniteLossError(
                f"step {int(bad_steps.min())}: the loss is NaN or infinite on {bad_steps.numel()} rank(s); stopped "
                "without saving (the last checkpoint is the last good state); lower the learning rates?"
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
        self, model: torch.nn.Module, optimizer: TrainOptimizer, device: torch.device, pipeline: str
    ) -> None:
        self.model = model
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

    def run(self, batches: Iterator[Batch]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Train on every batch of `batches`; yields (loss_sum, real samples) of this rank per
        step."""
        self.model.train()
        if self.pipeline is not None:
            while True:
                try:
                    loss_sum, _, labels = self.pipeline.progress(batches)
                except StopIteration:
                    return
                name = type(self.pipeline).__name__
                self.steps_by[name] = self.steps_by.get(name, 0) + 1
                yield loss_sum, (labels >= 0).sum()
        else:
            for batch in batches:
                if self.device.type != "cpu":
                    batch = batch.to(self.device, non_blocking=True)
                self.optimizer.zero_grad()
                loss, (loss_sum, _, labels) = self.model(batch)
                loss.backward()
                self.optimizer.step()
                self.steps_by["plain"] = self.steps_by.get("plain", 0) + 1
                yield loss_sum, (labels >= 0).sum()

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
        _, (_, batch_logits, batch_labels) = model(batch.to(device))
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
