"""The step loop: runs training in segments between evaluation/checkpoint boundaries.

Training proceeds in segments of whole steps. At a segment's end the pipeline has run every
batch it was given (none is in flight), so the model, the optimizers and the loader's position
all describe the same step: that is where checkpoints are written and evaluation runs, which
is what makes a resumed run bitwise equal to an uninterrupted one.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torchrec.datasets.utils import Batch
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

from shardrec.trainer.metrics import binary_metrics
from shardrec.trainer.optim import TrainOptimizer

logger = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; training stops without saving the bad weights."""


@dataclass
class StepStats:
    step: int
    loss: float
    samples: int


class StepRunner:
    """Runs steps with torchrec's TrainPipelineSparseDist (overlapping input distribution with
    compute) or a plain forward/backward/step loop; the arithmetic is the same."""

    def __init__(self, model: torch.nn.Module, optimizer: TrainOptimizer, device: torch.device, pipeline: str) -> None:
        self.model = model
        self.optimizer = optimizer
        self.device = device
        self.pipeline = None
        if pipeline == "sparse_dist":
            self.pipeline = TrainPipelineSparseDist(model, optimizer, device, execute_all_batches=True)  # type: ignore[arg-type]

    def run(self, batches: Iterator[Batch]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Train on every batch of `batches`; yields (loss_sum, real samples) of this rank per step."""
        self.model.train()
        if self.pipeline is not None:
            while True:
                try:
                    loss_sum, _, labels = self.pipeline.progress(batches)
                except StopIteration:
                    return
                yield loss_sum, (labels >= 0).sum()
        else:
            for batch in batches:
                batch = batch.to(self.device)
                self.optimizer.zero_grad()
                loss, (loss_sum, _, labels) = self.model(batch)
                loss.backward()
                self.optimizer.step()
                yield loss_sum, (labels >= 0).sum()

    def eval_mode(self) -> torch.nn.Module:
        """The model with its original (unpipelined) forward, for evaluation between segments."""
        if self.pipeline is not None:
            self.pipeline.detach()
        self.model.eval()
        return self.model


def train_segment(
    runner: StepRunner,
    batches: Iterator[Batch],
    num_steps: int,
    first_step: int,
    on_step: Callable[[StepStats], None],
) -> int:
    """Run up to `num_steps` steps from `batches`; returns how many ran (fewer if they ran out).

    Every step all-reduces [loss sum, samples, non-finite flag] so that all ranks see the same
    global loss and stop together on NaN/inf.
    """
    done = 0
    for loss_sum, samples in runner.run(itertools.islice(batches, num_steps)):
        done += 1
        bad = (~torch.isfinite(loss_sum)).to(torch.float64)
        reduced = torch.stack([loss_sum.double().nan_to_num(0.0, 0.0, 0.0), samples.double(), bad]).cpu()
        if dist.is_initialized():
            dist.all_reduce(reduced)
        step = first_step + done
        if reduced[2] > 0:
            raise NonFiniteLossError(
                f"step {step}: the loss is NaN or infinite on {int(reduced[2])} rank(s); stopped without "
                "saving (the last checkpoint is the last good state); lower the learning rates?"
            )
        n = int(reduced[1])
        on_step(StepStats(step, float(reduced[0]) / max(n, 1), n))
    return done


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: Iterator[Batch], device: torch.device, max_batches: int = 0) -> dict[str, Any]:
    """AUC / log loss / NE over every rank's predictions (all ranks must pass equal batch counts)."""
    logits, labels = [], []
    for i, batch in enumerate(batches):
        if max_batches and i >= max_batches:
            break
        _, (_, batch_logits, batch_labels) = model(batch.to(device))
        logits.append(batch_logits.float().cpu())
        labels.append(batch_labels.float().cpu())
    local = torch.stack([torch.cat(logits), torch.cat(labels)]) if logits else torch.zeros(2, 0)
    if dist.is_initialized() and dist.get_world_size() > 1:
        gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, local)
        local = torch.cat(gathered, dim=1)
    return binary_metrics(local[0], local[1])
