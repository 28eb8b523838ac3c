"""Evaluation metrics: AUC, log loss and normalized entropy of a model's predictions."""

from __future__ import annotations

import math

import numpy as np
import torch


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve by the rank-sum statistic; tied scores share their mean rank."""
    labels = labels.astype(bool)
    positives = int(labels.sum())
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    mean_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based mean rank of each distinct score
    rank_sum = float(mean_rank[inverse][labels].sum())
    return (rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives)


def binary_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """AUC, log loss and normalized entropy of logits against 0/1 labels (rows with label < 0 ignored)."""
    keep = labels >= 0
    logits, labels = logits[keep].double(), labels[keep].double()
    n = int(labels.numel())
    if n == 0:
        return {"auc": float("nan"), "logloss": float("nan"), "ne": float("nan"), "samples": 0}
    logloss = float(torch.nn.functional.binary_cross_entropy_with_logits(logits, labels))
    p = float(labels.mean())
    # Normalized entropy: log loss relative to always predicting the base rate.
    base = -(p * math.log(p) + (1 - p) * math.log(1 - p)) if 0 < p < 1 else float("nan")
    return {
        "auc": auc(logits.numpy(), labels.numpy()),
        "logloss": logloss,
        "ne": logloss / base if base == base and base > 0 else float("nan"),
        "samples": n,
    }
