"""The settings that shape what a run's checkpoints hold (the model, its tables' rows, the
optimizers' kinds) stay the run's: a resume or a new stretch that changes one is refused in one
line before any rank starts, --allow-change or not."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import write_tiny_dataset
from helpers import assert_one_line_error, cli

from shardrec.dataloader.format.manifest import Manifest
from shardrec.trainer.job.config import load_job_config
from shardrec.trainer.rundir.life.trained_data import dataset_record

SHOWN_BACK = (
    "the shape of the run's model and optimizer state, which its checkpoints hold; set it back, "
    "or start a new run (--restart, or another --out-dir)"
)


def _complete_run(run: Path, data: Path) -> None:
    """A run directory trained on `data`, complete at step 4 (what the checks read)."""
    (run / "checkpoints" / "step-00000004").mkdir(parents=True)
    (run / "checkpoints" / "step-00000004" / "digests.json").write_text('{"files": {}}')
    job = [f'data.path="{data}"', "train.steps=4", "train.global_batch_size=64"]
    (run / "config.toml").write_text(load_job_config(None, job).to_toml())
    (run / "summary.json").write_text(json.dumps({"steps": 4}))
    (run / "dataset.json").write_bytes(dataset_record(str(data), Manifest.load(data)))


@pytest.mark.parametrize(
    ("change", "allow", "shown"),
    [
        ("model.dense_arch=[32, 16]", "model", "model.dense_arch: [64, 16] -> [32, 16]"),
        ("model.over_arch=[32, 1]", "model.over_arch", "model.over_arch: [64, 32, 1] -> [32, 1]"),
        ('optim.dense="adam"', "optim", "optim.dense: 'adagrad' -> 'adam'"),
    ],
)
def test_a_resume_that_reshapes_the_checkpoint_is_refused_before_any_rank_starts(
    tiny_dataset: Path, tmp_path: Path, change: str, allow: str, shown: str
) -> None:
    # Allowed, it passed here; the ranks started, loaded the checkpoint and refused it: "error:
    # training failed: rank 0: r1b/checkpoints/step-00000030: checkpoint of another model,
    # optimizer or dataset: model.embedding_dim: checkpoint 8, job 16; ...; to resume from the one
    # before it, ... move r1b/checkpoints/step-00000030 out of r1b/checkpoints, ...".
    run = tmp_path / "run"
    _complete_run(run, tiny_dataset)
    resumed = cli(
        "train", "--data", tiny_dataset, "--out-dir", run, "--steps", "8",
        "--set", "train.global_batch_size=64", "--set", change, "--allow-change", allow, ok=False,
    )  # fmt: skip
    assert_one_line_error(resumed, f"^{re.escape(f'error: {run}: {shown}: {SHOWN_BACK}')}$")


def test_a_new_stretch_of_other_table_rows_is_refused_before_any_rank_starts(
    tmp_path: Path,
) -> None:
    # A stretch on the next day's data with other data.multihot_rows (the tables' rows) passed
    # here and failed on the ranks: "error: training failed: rank 0: ...: checkpoint of another
    # model, optimizer or dataset: table t_C1 [rows, dim]: checkpoint [500, 8], job [400, 8]; ...".
    write_tiny_dataset(tmp_path / "day0")
    write_tiny_dataset(tmp_path / "day1", seed=1)
    run = tmp_path / "run"
    _complete_run(run, tmp_path / "day0")
    goes_on = cli(
        "train", "--out-dir", run, "--continue-on", tmp_path / "day1",
        "--set", "data.multihot_rows=[40, 200, 7, 900]", "--set", "data.multihot_sizes=[1, 2, 1, 3]",
        "--allow-change", "data", ok=False,
    )  # fmt: skip
    shown = f"error: {run}: data.multihot_rows: [] -> [40, 200, 7, 900]: {SHOWN_BACK}"
    assert_one_line_error(goes_on, f"^{re.escape(shown)}$")
