"""A plan made for other settings than the job's: its fingerprint holds the tables, world size,
batch and device, not the sparse optimizer, the dense layers, the constraints or the ranks a host
that its estimate and layout assumed. Each is refused in one line naming the plan and what differs
(a constraint the plan breaks is said, and the plan followed). README, Failures and trust: Plan
files."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.tools.cli.app import app

runner = CliRunner()
JOB = ["--set", "train.global_batch_size=64", "--set", 'train.device="cpu"']


def test_a_plan_estimated_for_another_sparse_optimizer_is_refused(
    tiny_dataset: Path, tmp_path: Path
):
    """The fingerprint holds tables, ranks, batch and device, not the optimizer whose state the
    memory estimate counts: trained with Adagrad (4 B a weight; Adam on CUDA: 8 B) on a row-wise
    Adagrad plan (4 B a row), the run's plan.json understated each rank's memory, and on CUDA the
    fit check at start compared that figure with the free memory."""
    path = tmp_path / "plan.json"
    planned = runner.invoke(
        app, ["plan", "--data", str(tiny_dataset), "--world-size", "1", "--out", str(path), *JOB]
    )
    assert planned.exit_code == 0, planned.output
    result = runner.invoke(
        app,
        ["train", "--data", str(tiny_dataset), "--plan", str(path), "--out-dir", str(tmp_path / "run"),
         "--nproc-per-node", "1", *JOB, "--set", 'optim.sparse="adagrad"'],
    )  # fmt: skip
    assert_one_line_error(
        result,
        "^error: "
        + re.escape(
            f"{path}: the plan's memory estimate counts another sparse optimizer's state: rank 0 "
            "holds 5.30 KiB of it by the plan, optim.sparse = 'adagrad' needs 84.81 KiB (re-run "
            "`shardrec plan` with this job's settings)"
        )
        + "$",
    )
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_plan_estimated_for_other_dense_layers_is_refused(tiny_dataset: Path, tmp_path: Path):
    """The fingerprint holds the tables, not model.dense_arch: a plan made for the default dense
    layers counted their parameters (and optimizer state) on every rank; trained with wider ones,
    the run's plan.json understated each rank's memory without a word."""
    path = tmp_path / "plan.json"
    planned = runner.invoke(
        app, ["plan", "--data", str(tiny_dataset), "--world-size", "1", "--out", str(path), *JOB]
    )
    assert planned.exit_code == 0, planned.output
    wider = ["--set", "model.dense_arch=[64, 32, 16]"]
    result = runner.invoke(
        app,
        ["train", "--data", str(tiny_dataset), "--plan", str(path), "--out-dir", str(tmp_path / "run"),
         "--nproc-per-node", "1", *JOB, *wider],
    )  # fmt: skip
    assert_one_line_error(
        result,
        "^error: "
        # Said by the rank that built the model (the launcher imports no torchrec to count it).
        + re.escape(f"training failed: rank 0: {path}: the plan's memory estimate counts ")
        + "other dense layers: "
        + r"[\d.]+ KiB of dense parameters by the plan, this job's model has [\d.]+ KiB "
        + re.escape("(re-run `shardrec plan` with this job's settings)")
        + "$",
    )
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_plan_that_breaks_the_jobs_constraints_is_said_when_training_starts(
    tiny_dataset: Path, tmp_path: Path, caplog
):
    """The job pins t_f0 row-wise; the plan, made without its constraints, has it table-wise: the
    plan wins (a plan may change freely), but the run's config.toml says row-wise, so it is said."""
    path = tmp_path / "plan.json"
    free = ["--set", "sharding.constraints={}"]
    planned = runner.invoke(
        app,
        ["plan", "--data", str(tiny_dataset), "--world-size", "1", "--out", str(path), *JOB, *free],
    )
    assert planned.exit_code == 0, planned.output
    pinned = ["--set", 'sharding.constraints={t_f0={sharding_types=["row_wise"]}}']
    result = runner.invoke(
        app,
        ["train", "--data", str(tiny_dataset), "--plan", str(path), "--out-dir", str(tmp_path / "run"),
         "--nproc-per-node", "1", "--steps", "1", *JOB, *pinned],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (
        f"{path}: table t_f0 is table_wise in the plan, not as the job's "
        "sharding.constraints.t_f0 asks (sharding_types ['row_wise']): the plan is followed; "
        "re-run `shardrec plan` with this job's settings to follow them"
    ) in caplog.text, caplog.text[-3000:]


def test_a_plan_for_hosts_of_another_size_is_refused_naming_the_table(
    tiny_dataset: Path, tmp_path: Path
):
    """The fingerprint holds the world size, not the ranks a host: a table-row-wise table planned
    for two hosts of one rank lies whole on rank 0, which torchrec cannot build on one host of two
    (before: every rank's IndexError inside torchrec's sharder)."""
    path = tmp_path / "plan.json"
    pinned = ["--set", "sharding.constraints={t_f0={sharding_types=['table_row_wise']}}"]
    planned = runner.invoke(
        app,
        ["plan", "--data", str(tiny_dataset), "--world-size", "2", "--local-world-size", "1",
         "--out", str(path), *JOB, *pinned],
    )  # fmt: skip
    assert planned.exit_code == 0, planned.output
    result = runner.invoke(
        app,
        ["train", "--data", str(tiny_dataset), "--plan", str(path), "--out-dir", str(tmp_path / "run"),
         "--nproc-per-node", "2", *JOB],
    )  # fmt: skip
    assert_one_line_error(
        result,
        "^error: "
        + re.escape(
            f"{path}: table t_f0 is table_row_wise, laid out for hosts of 1 rank (the plan's "
            "--local-world-size); this job runs 2 ranks a host: re-run `shardrec plan "
            "--local-world-size 2`"
        )
        + "$",
    )
    assert not (tmp_path / "run").exists()
