"""A resume of a run that made multi-hot ids on the fly (data.multihot_*): those settings make the
stream it goes on in the middle of, so a change is refused in one line before any rank starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import cli

SIZES = "data.multihot_sizes=[2, 3, 1, 2]"
"""Ids per sample of the tiny dataset's four sparse features."""


def _run_at_step_4(run: Path, data: Path) -> None:
    """A run directory stopped at step 4 (one complete checkpoint) that trained with SIZES."""
    from shardrec.trainer.job.config import load_job_config

    (run / "checkpoints" / "step-00000004").mkdir(parents=True)
    (run / "checkpoints" / "step-00000004" / "digests.json").write_text('{"files": {}}')
    job = [f'data.path="{data}"', SIZES, "train.global_batch_size=64", "train.seed=0"]
    (run / "config.toml").write_text(load_job_config(None, job).to_toml())


@pytest.mark.parametrize(
    ("change", "shown"),
    [
        ("data.multihot_seed=7", "data.multihot_seed: 0 -> 7"),
        ('data.multihot_dist="pareto"', "data.multihot_dist: 'uniform' -> 'pareto'"),
        ("data.multihot_sizes=[2, 3, 1, 5]", "data.multihot_sizes: [2, 3, 1, 2] -> [2, 3, 1, 5]"),
        ("data.multihot_rows=[50, 300, 7, 900]", "data.multihot_rows: [] -> [50, 300, 7, 900]"),
    ],
)
def test_a_changed_multihot_setting_is_refused_before_any_rank_starts(
    tiny_dataset: Path, tmp_path: Path, change: str, shown: str
) -> None:
    # Allowed, it passed here; the ranks started, loaded the checkpoint and refused its loader
    # state: "error: training failed: rank 0: loader state has fingerprint='a81d...' but this
    # loader has 'd535...': not the same stream; the newest complete checkpoint, ... is kept".
    run = tmp_path / "run"
    _run_at_step_4(run, tiny_dataset)
    key = change.partition("=")[0]
    resumed = cli(
        "train", "--data", tiny_dataset, "--out-dir", run, "--nproc-per-node", "1",
        "--set", SIZES, "--set", "train.global_batch_size=64", "--set", change,
        "--allow-change", key, ok=False,
    )  # fmt: skip
    assert resumed.exit_code == 1, resumed.output
    assert resumed.stderr.strip().splitlines() == [
        f"error: {run}: {shown}: the run's data stream, which a resume goes on in the middle of; "
        "set it back, or start a new run (--restart, or another --out-dir)"
    ]
