"""The training objective, and the one gradient semantics that makes plans interchangeable.

Every parameter is updated with the gradient of the GLOBAL mean loss:

    L = sum over the real samples of the global batch of BCE(logit, label) / global_batch_size

whatever the plan or world size. Gradients cross ranks two ways, and both AVERAGE over ranks:

- dense layers and data-parallel tables go through DDP, which all-reduces and divides by W;
- sharded tables (table-, row-, column-wise, ...) receive every rank's gradient through the
  backward of the embedding all-to-all / reduce-scatter, which torchrec divides by W too
  (`torchrec.distributed.comm_ops` gradient division, on by default; checked at start-up).

So rank r's loss is W * sum_r / global_batch_size: averaged over the W ranks its gradient is
exactly that of L, for every parameter. For world sizes that are powers of two the scaling
is exact, so runs under different plans differ only in the order of floating-point sums.
Padding rows (label < 0, from `tail = "pad"`) contribute nothing; the denominator stays the
nominal global batch size, so a padded last batch takes a proportionally smaller step.

One optimizer is not plan-invariant by construction: fbgemm's row-wise Adagrad keeps one
accumulator per row of each column shard, so cutting a table by columns changes its
statistics (mean of g^2 over the shard's columns instead of the whole row). Plans without
column cuts (table-wise, row-wise, table-row-wise, data-parallel) agree under every optimizer;
column-wise plans agree with them under sgd and adam (element-wise state).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchrec.datasets.utils import Batch

from shardrec.trainer.model.models import EBC_PATH, EC_PATH

# Path of the EmbeddingBagCollection from the module DistributedModelParallel wraps.
TRAIN_EBC_PATH = f"model.{EBC_PATH}"
# Path of a sequence model's EmbeddingCollection (its unpooled tables).
TRAIN_EC_PATH = f"model.{EC_PATH}"


class TrainModule(nn.Module):
    """Wraps a model so that `module(batch)` returns (loss, (loss_sum, logits, labels, finite flags)),
    the contract of torchrec's train pipelines."""

    def __init__(
        self, model: nn.Module, global_batch_size: int, world_size: int, loss_weight: float = 1.0
    ) -> None:
        super().__init__()
        self.model = model
        # W / global batch: the ranks' average gradient is then that of the global mean loss
        # (times optim.loss_weight, DLRMv4's 0.2; the reported loss_sum is unweighted).
        self.loss_scale = world_size / global_batch_size * loss_weight

    def forward(
        self, batch: Batch
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        finite: list[torch.Tensor] = []
        logits = self.model(batch.dense_features, batch.sparse_features, finite)
        labels = batch.labels.to(logits.dtype)
        mask = (labels >= 0).to(logits.dtype)
        losses = F.binary_cross_entropy_with_logits(logits, labels.clamp(min=0), reduction="none")
        loss_sum = (losses * mask).sum()
        # Whether each stage was finite (models.finite_stages): a NaN loss names where it began.
        flags = torch.cat(finite)
        return loss_sum * self.loss_scale, (loss_sum.detach(), logits.detach(), labels, flags)
