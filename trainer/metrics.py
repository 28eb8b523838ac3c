"""Evaluation metrics (AUC, log loss, normalized entropy) and the run's metrics.jsonl."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
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
    import torch  # here, so reading metrics.jsonl (runs, report, lifecycle) does not import torch

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


class MetricsWriter:
    """Appends one JSON object per line to RUN/metrics.jsonl (and TensorBoard when installed).

    Each line is flushed and fsynced, so a killed run keeps every line written before the kill.
    """

    def __init__(self, run_dir: Path, tensorboard: bool = True) -> None:
        self.path = run_dir / "metrics.jsonl"
        run_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional
                pass
            else:
                self._tb = SummaryWriter(str(run_dir / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, sort_keys=True) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        if self._tb is not None and "step" in record:
            prefix = record.get("kind", "train")
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "step" and not isinstance(value, bool):
                    self._tb.add_scalar(f"{prefix}/{key}", value, record["step"])

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


@dataclass(frozen=True)
class MetricsLog:
    """RUN/metrics.jsonl as read: its records and the line numbers of torn lines skipped."""

    path: Path
    records: list[dict[str, Any]]
    skipped: list[int]


def load_metrics(run_dir: Path, *, torn: Literal["error", "last", "any"] = "error") -> MetricsLog:
    """Read RUN/metrics.jsonl; ValueError names the run directory when it has none.

    torn: what a line that is not a JSON object means. "error": ValueError naming file:line.
    "last": a torn last line (a run killed while appending it) is skipped, any other is an
    error. "any": every such line is skipped (status displays that must not fail on a record).
    """
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"{run_dir}: no metrics.jsonl (not a shardrec run directory?)")
    lines = path.read_bytes().split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records, skipped = [], []
    for i, line in enumerate(lines[: last + 1]):
        if not line.strip():
            continue
        try:
            record = json.loads(line)  # bytes that are not UTF-8 raise a ValueError too
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not an object")
        except ValueError as e:
            if torn == "any" or (torn == "last" and i == last):
                skipped.append(i + 1)
                continue
            hint = "; only a torn last line is skipped" if torn == "last" else ""
            raise ValueError(f"{path}:{i + 1}: not a JSON record ({e}){hint}") from None
        records.append(record)
    return MetricsLog(path, records, skipped)


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of RUN/metrics.jsonl; ValueError names the file and line of a bad one."""
    return load_metrics(run_dir).records
