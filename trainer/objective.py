"""The training objective, and the one gradient semantics that makes plans interchangeable.

Every parameter is updated with the gradient of the GLOBAL mean loss:

    L = sum over the real samples of the global batch of BCE(logit, label) / global_batch_size

whatever the plan or world size. The two ways gradients cross ranks disagree by default:

- sharded tables (table-, row-, column-wise, ...) receive the SUM of every rank's gradient
  through the backward all-to-all;
- dense layers and data-parallel tables go through DDP, which AVERAGES over ranks.

So each rank's loss is its share of the global sum, `sum_r / global_batch_size` (right as it
is for sharded tables), and the gradients that DDP averaged are multiplied by the world size
before the optimizer step (`trainer.optim.TrainOptimizer`). For world sizes that are powers
of two the multiplication is exact, so only the order of floating-point sums differs between
plans. Padding rows (label < 0, from `tail = "pad"`) contribute nothing; the denominator stays
the nominal global batch size, so a padded last batch takes a proportionally smaller step.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchrec.datasets.utils import Batch

from shardrec.trainer.models import EBC_PATH

# Path of the EmbeddingBagCollection from the module DistributedModelParallel wraps.
TRAIN_EBC_PATH = f"model.{EBC_PATH}"


class TrainModule(nn.Module):
    """Wraps a model so that `module(batch)` returns (loss, (loss_sum, logits, labels)),
    the contract of torchrec's train pipelines."""

    def __init__(self, model: nn.Module, global_batch_size: int) -> None:
        super().__init__()
        self.model = model
        self.global_batch_size = global_batch_size

    def forward(self, batch: Batch) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        logits = self.model(batch.dense_features, batch.sparse_features)
        labels = batch.labels.to(logits.dtype)
        mask = (labels >= 0).to(logits.dtype)
        losses = F.binary_cross_entropy_with_logits(logits, labels.clamp(min=0), reduction="none")
        loss_sum = (losses * mask).sum()
        return loss_sum / self.global_batch_size, (loss_sum.detach(), logits.detach(), labels)
