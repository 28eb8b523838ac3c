"""The training rate a run reports (summary.json's train_samples_per_s, `training: N samples/s`)
counts the samples trained on: a padded last batch's filler rows are none."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import TINY_MODEL, settings, train_command


def test_a_padded_last_batch_counts_its_real_samples_in_the_rate(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    # 1,000 training rows in global batches of 600, padded: 2 steps of 600 and 400 samples. The
    # rate had counted 1,200.
    job = settings(
        *TINY_MODEL,
        'data.tail="pad"',
        "train.global_batch_size=600",
        'data.eval_splits=["val"]',
        'train.device="cpu"',
    )
    done = subprocess.run(
        train_command(tiny_dataset, tmp_path / "run", *job, nproc=1),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 2
    trained = summary["train_samples_per_s"] * summary["train_seconds"]
    assert abs(trained - 1000) < 2, trained
