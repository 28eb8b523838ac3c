"""AUC, log loss and normalized entropy against brute-force definitions."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from helpers import tensorboard_scalars

from shardrec.trainer.loop.metrics import auc, binary_metrics
from shardrec.trainer.rundir.metrics_log import (
    MetricsWriter,
    auc_text,
    read_metrics,
    tensorboard_dir,
)


def _pairwise_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    pos, neg = scores[labels == 1], scores[labels == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def test_auc_equals_the_pairwise_definition_with_ties() -> None:
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 6, 200).astype(np.float64)  # many ties
    labels = (rng.random(200) < 0.3).astype(np.int64)
    assert auc(scores, labels) == pytest.approx(_pairwise_auc(scores, labels), abs=1e-12)
    assert auc(np.array([0.1, 0.9]), np.array([0, 1])) == 1.0
    assert math.isnan(auc(np.array([0.1, 0.9]), np.array([1, 1])))


def _np_unique_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """The AUC shardrec computed on the host before it moved to the scores' device: np.unique's
    mean ranks, summed as float64."""
    labels = labels.astype(bool)
    positives = int(labels.sum())
    negatives = len(labels) - positives
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    mean_rank = np.cumsum(counts) - (counts - 1) / 2.0
    rank_sum = float(mean_rank[inverse][labels].sum())
    return (rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives)


@pytest.mark.parametrize("ties", [False, True])
def test_auc_on_tensors_equals_the_host_np_unique_auc(ties: bool) -> None:
    rng = np.random.default_rng(1)
    n = 200_003
    logits = rng.normal(size=n).astype(np.float32)
    if ties:
        logits = np.round(logits, 2)  # a few hundred distinct scores
    labels = (rng.random(n) < 1 / (1 + np.exp(-logits))).astype(np.float32)
    expected = _np_unique_auc(logits.astype(np.float64), labels)
    got = auc(torch.from_numpy(logits), torch.from_numpy(labels))
    assert abs(got - expected) <= 1e-12 and got == expected
    metrics = binary_metrics(torch.from_numpy(logits), torch.from_numpy(labels))
    assert metrics["auc"] == expected


def test_logloss_and_ne_ignore_padding_rows() -> None:
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0, 9.0])
    labels = torch.tensor([1.0, 0.0, 1.0, 0.0, -1.0])  # the last row is padding
    m = binary_metrics(logits, labels)
    p = torch.sigmoid(logits[:4]).double()
    y = labels[:4].double()
    expected = float(-(y * p.log() + (1 - y) * (1 - p).log()).mean())
    assert m["samples"] == 4 and m["logloss"] == pytest.approx(expected)
    assert m["ne"] == pytest.approx(expected / math.log(2))  # base rate 0.5: entropy ln 2
    assert m["auc"] == pytest.approx(0.5)  # positives 2.0, 0.5 beat -1.0 but not 3.0


def test_metrics_file_round_trips_and_names_a_bad_line(tmp_path) -> None:
    writer = MetricsWriter(tmp_path, tensorboard=False)
    writer.write({"kind": "train", "step": 1, "loss": 0.5})
    writer.close()
    assert read_metrics(tmp_path) == [{"kind": "train", "loss": 0.5, "step": 1}]
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write("{not json\n")
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        read_metrics(tmp_path)


def test_tensorboard_keeps_each_eval_split_on_a_curve_of_its_own(tmp_path) -> None:
    # tensorboard is in the test extra: without it this fails rather than skips.
    writer = MetricsWriter(tmp_path)
    writer.write({"kind": "train", "step": 3, "loss": 0.5})
    for step in (3, 6):
        writer.write({"kind": "eval", "split": "val", "step": step, "auc": 0.7, "final": False})
        writer.write({"kind": "eval", "split": "test", "step": step, "auc": 0.6, "ne": 0.9})
    writer.close()
    assert tensorboard_scalars(tmp_path) == {
        "train/loss": [(3, 0.5)],
        "eval/val/auc": [(3, 0.7), (6, 0.7)],
        "eval/test/auc": [(3, 0.6), (6, 0.6)],
        "eval/test/ne": [(3, 0.9), (6, 0.9)],
    }


def test_a_resumed_run_replaces_the_tensorboard_steps_written_after_its_checkpoint(
    tmp_path,
) -> None:
    # Killed at step 10 after its checkpoint at 8: the resumed run trains and evaluates 9-10
    # again, and TensorBoard shows step 10 once, as the resumed run wrote it.
    killed = MetricsWriter(tmp_path)
    for step, loss in ((5, 0.5), (10, 0.4)):
        killed.write({"kind": "train", "step": step, "loss": loss})
    killed.write({"kind": "eval", "split": "val", "step": 10, "auc": 0.7})
    killed.close()
    resumed = MetricsWriter(tmp_path, resumed_at=8)
    resumed.write({"kind": "train", "step": 10, "loss": 0.3})
    resumed.write({"kind": "eval", "split": "val", "step": 10, "auc": 0.75})
    resumed.close()
    scalars = tensorboard_scalars(tmp_path)
    assert scalars["train/loss"] == [(5, 0.5), (10, 0.3)]
    assert scalars["eval/val/auc"] == [(10, 0.75)]


def test_each_stretch_of_a_run_that_went_on_has_its_own_tensorboard_run(
    tmp_path, monkeypatch
) -> None:
    # A run continued on days/1 wrote day 1's evaluations under day 0's tags, in day 0's folder:
    # TensorBoard drew eval/test/auc as one line from day 0's test split to day 1's.
    for stretch, step, value in ((0, 10, 0.65), (1, 20, 0.70)):
        writer = MetricsWriter(tmp_path, stretch=stretch, data=str(tmp_path / "days" / "1"))
        writer.write({"kind": "eval", "split": "test", "step": step, "auc": value})
        writer.close()
    assert tensorboard_scalars(tmp_path) == {"eval/test/auc": [(10, 0.65)]}
    folder = "stretch-1-days-1"
    assert tensorboard_scalars(tmp_path, folder) == {"eval/test/auc": [(20, 0.7)]}
    # the same folder from the path as given and as a resume of the stretch reads it (absolute)
    monkeypatch.chdir(tmp_path)
    assert tensorboard_dir(tmp_path, 1, "days/1") == tmp_path / "tensorboard" / folder


@pytest.mark.parametrize("label", [0.0, 1.0])
def test_an_eval_split_of_one_class_has_a_log_loss_but_no_auc_or_ne(label: float) -> None:
    """A split whose rows are all clicks (or all non-clicks) has no ranking to score and no base
    rate entropy to normalize by: AUC and NE are NaN, the log loss is still the mean loss."""
    logits = torch.tensor([0.5, -2.0, 1.0, 3.0])
    labels = torch.full((4,), label)
    m = binary_metrics(logits, labels)
    expected = float(
        torch.nn.functional.binary_cross_entropy_with_logits(logits.double(), labels.double())
    )
    assert m["samples"] == 4 and m["logloss"] == pytest.approx(expected)
    assert math.isnan(m["auc"]) and math.isnan(m["ne"])


def test_an_eval_of_only_padding_rows_reports_no_samples() -> None:
    m = binary_metrics(torch.tensor([0.3, -0.3]), torch.tensor([-1.0, -1.0]))
    assert sorted(m) == ["auc", "logloss", "ne", "samples"] and m["samples"] == 0
    assert all(math.isnan(m[k]) for k in ("auc", "logloss", "ne"))


def test_a_one_row_eval_counts_its_row_and_its_loss() -> None:
    m = binary_metrics(torch.tensor([2.0, 0.0]), torch.tensor([1.0, -1.0]))
    assert m["samples"] == 1 and m["logloss"] == pytest.approx(math.log1p(math.exp(-2.0)))
    assert math.isnan(m["auc"]) and math.isnan(m["ne"])


def test_an_auc_without_a_value_says_why():
    """A split of one class (or none) has no AUC: the printed line says which, not 'nan'."""
    one_class = binary_metrics(torch.tensor([0.3, -1.0, 2.0]), torch.tensor([0.0, 0.0, 0.0]))
    assert auc_text(one_class) == "n/a (labels of one class)"
    empty = binary_metrics(torch.zeros(0), torch.zeros(0))
    assert auc_text(empty) == "n/a (no samples)"
    both = binary_metrics(torch.tensor([0.3, -1.0, 2.0]), torch.tensor([1.0, 0.0, 1.0]))
    assert auc_text(both) == "1.0000" and auc_text(both, 6) == "1.000000"
