"""An eval.every_epoch_fraction of less than one step of the data makes the run evaluate after
every step (the schedule's least interval); the run says so before it trains."""

from __future__ import annotations

from pathlib import Path

from helpers import train_tiny


def test_a_fraction_below_one_step_is_named_with_the_step_it_would_take(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    # 1,000 training rows in batches of 128: 0.05 of the epoch is 50 rows, less than a step. The
    # run had evaluated after each of its 7 steps without a word.
    done = train_tiny(
        tiny_dataset,
        tmp_path / "run",
        "train.global_batch_size=128",
        "eval.every_epoch_fraction=0.05",
    )
    said = [line for line in done.stderr.splitlines() if "eval.every_epoch_fraction" in line]
    assert len(said) == 1, done.stderr
    assert said[0].endswith(
        "eval.every_epoch_fraction = 0.05 is less than one step of 1,000 training samples in "
        "global batches of 128 (a step is 0.128 of the epoch): the run evaluates after every "
        "step; raise it, or set eval.interval_steps instead"
    )
