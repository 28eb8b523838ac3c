"""The training rate a run reports (summary.json's train_samples_per_s, `training: N samples/s`)
counts the samples trained on: a padded last batch's filler rows are none."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import train_tiny


def test_a_padded_last_batch_counts_its_real_samples_in_the_rate(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    # 1,000 training rows in global batches of 600, padded: 2 steps of 600 and 400 samples. The
    # rate had counted 1,200.
    train_tiny(tiny_dataset, tmp_path / "run", 'data.tail="pad"', "train.global_batch_size=600")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 2
    trained = summary["train_samples_per_s"] * summary["train_seconds"]
    assert abs(trained - 1000) < 2, trained
