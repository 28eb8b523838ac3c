"""Evaluation metrics: AUC, log loss and normalized entropy of a model's predictions."""

from __future__ import annotations

import math

import numpy as np
import torch


def auc(scores: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray) -> float:
    """Area under the ROC curve by the rank-sum statistic; tied scores share their mean rank.

    Runs where the scores are (the GPU for a CUDA job: one sort, no copy of every prediction to
    the host and no np.unique). Ranks are kept doubled, 2 x mean rank being an integer, so the
    rank sum is exact in int64: the result does not depend on the device or the order of the sum.
    """
    scores = torch.as_tensor(scores)
    labels = torch.as_tensor(labels, device=scores.device).bool()
    positives = int(labels.sum())
    negatives = labels.numel() - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    ordered, order = torch.sort(scores)
    starts = torch.ones_like(ordered, dtype=torch.bool)
    starts[1:] = ordered[1:] != ordered[:-1]
    tie_group = torch.cumsum(starts, 0) - 1
    counts = torch.bincount(tie_group)
    doubled_rank = (
        2 * torch.cumsum(counts, 0) - counts + 1
    )  # 2 x the 1-based mean rank of each tie group
    rank_sum = int(doubled_rank[tie_group][labels[order]].sum()) / 2
    return (rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives)


def binary_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """AUC, log loss and normalized entropy of logits against 0/1 labels (rows with label < 0
    ignored), computed on the tensors' device."""
    keep = labels >= 0
    scores = logits[keep]  # AUC needs only their order: as given, they sort and tie as in float64
    logits, labels = scores.double(), labels[keep].double()
    n = int(labels.numel())
    if n == 0:
        return {"auc": float("nan"), "logloss": float("nan"), "ne": float("nan"), "samples": 0}
    logloss = float(torch.nn.functional.binary_cross_entropy_with_logits(logits, labels))
    p = float(labels.mean())
    # Normalized entropy: log loss relative to always predicting the base rate.
    base = -(p * math.log(p) + (1 - p) * math.log(1 - p)) if 0 < p < 1 else float("nan")
    return {
        "auc": auc(scores, labels),
        "logloss": logloss,
        "ne": logloss / base if base == base and base > 0 else float("nan"),
        "samples": n,
    }
