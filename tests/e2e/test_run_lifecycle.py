"""A run directory's life through `shardrec train` (README, "A run directory has a life"): a rerun
of a finished run writes nothing and says how to continue; changed settings are shown and refused
unless allowed, by `shardrec train` and by the ranks themselves (a direct torchrun); changed data is
always refused, and `shardrec eval` refuses it too unless --data asks for other data;
--restart moves the old run aside; a checkpoint copied in from another run is refused. Runs
refused or started again on their own tiny runs: test_run_dir_refusals.py.

One 10-step run of the module (one launch) starts both tours: each copies it and goes on from
there. The first tour trains twice more and evaluates once, the second trains twice more (once on
2 ranks); the refusals take no rank (the direct rank's refusal takes one process start). Nobody
changes the module's dataset: the tours change only data of their own."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import write_tiny_dataset
from helpers import assert_one_line_error, run_direct_rank, settings
from run_dirs import LIFECYCLE_JOB, train_in_process
from typer.testing import CliRunner

from shardrec.tools.cli.app import app


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny dataset (15 steps an epoch at this batch) and a run of `--steps 10` on it. Read
    only: a test copies the run before it trains on or moves it, and never rewrites the data."""
    root = tmp_path_factory.mktemp("lifecycle")
    write_tiny_dataset(root / "data")
    first = train_in_process(root / "data", root / "run", "--steps", "10")
    assert first.exit_code == 0, first.output
    return root / "data", root / "run"


def _copy_run(trained: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """(the module's dataset, a copy of its 10-step run in tmp_path/run)."""
    data, ran = trained
    shutil.copytree(ran, tmp_path / "run")
    return data, tmp_path / "run"


def test_rerun_resume_changes_data_and_restart(trained: tuple[Path, Path], tmp_path: Path) -> None:
    tiny_dataset, run = _copy_run(trained, tmp_path)
    record = {
        name: (run / name).read_bytes() for name in ("metrics.jsonl", "summary.json", "config.toml")
    }

    # 1: the same command again: complete, nothing written, the saved summary printed.
    again = train_in_process(tiny_dataset, run, "--steps", "10")
    assert again.exit_code == 0, again.output
    assert again.stderr.strip() == (
        f"{run} is complete: 10 steps (train.steps = 10); nothing to do. "
        "To continue it, raise --steps (or train.epochs); to start over, add --restart"
    )
    assert json.loads(again.stdout) == json.loads(record["summary.json"])
    assert {name: (run / name).read_bytes() for name in record} == record
    # 6: in text, the plan table comes first and the results last, with pointers to the files.
    text = CliRunner().invoke(
        app,
        [
            "train",
            "--data",
            str(tiny_dataset),
            "--out-dir",
            str(run),
            *LIFECYCLE_JOB,
            "--steps",
            "10",
        ],
    )
    lines = text.stdout.splitlines()
    plan_at = next(
        i for i, line in enumerate(lines) if line.strip().startswith("tables (4; planner")
    )
    auc_at = next(i for i, line in enumerate(lines) if "AUC" in line and "log loss" in line)
    assert plan_at < auc_at and lines[-1].split()[:2] == ["plan:", str(run / "plan.json")], (
        text.stdout
    )
    # No job trained now: no rate or resume line, which read as if it had.
    assert not [line for line in lines if line.startswith(("training:", "resumed from"))]

    # 2: a changed setting is shown and refused; a misspelt --allow-change gets a suggestion.
    changed = train_in_process(
        tiny_dataset,
        run,
        "--steps",
        "12",
        "--set",
        "optim.dense_lr=0.1",
        "--set",
        "optim.sparse_lr=1",
    )
    assert_one_line_error(
        changed,
        r"resuming with changed settings \(optim\.sparse_lr: 0\.05 -> 1\.0, optim\.dense_lr: 0\.05 -> 0\.1\); "
        r"accept them with --allow-change optim\.sparse_lr --allow-change optim\.dense_lr, "
        r"or start over with --restart$",
    )
    typo = train_in_process(tiny_dataset, run, "--allow-change", "optim.dense_rl")
    assert_one_line_error(
        typo, r"--allow-change optim\.dense_rl: no such setting; did you mean optim\.dense_lr\?$"
    )
    lower = train_in_process(tiny_dataset, run, "--steps", "2")
    assert_one_line_error(
        lower, r"has trained 10 steps, more than the 2 this job runs to .*a run cannot go back"
    )

    # 2: other data is refused, even with every setting allowed.
    other = tmp_path / "other"
    write_tiny_dataset(other, seed=5)
    refused = train_in_process(other, run, "--steps", "12", "--allow-change", "data")
    assert_one_line_error(
        refused, r"was trained on other data .*a run cannot resume on a changed dataset"
    )
    assert {name: (run / name).read_bytes() for name in record} == record

    # The ranks refuse it themselves, in the same line: `python -m shardrec.trainer` as torchrun
    # starts it on every node (the README's multi-node path), with no `shardrec train` before it.
    direct = run_direct_rank(
        "--data",
        str(tiny_dataset),
        "--out-dir",
        str(run),
        *LIFECYCLE_JOB,
        "--steps",
        "12",
        "--set",
        "optim.dense_lr=0.1",
    )
    assert_one_line_error(
        direct,
        rf"^error: {run}: resuming with changed settings \(optim\.dense_lr: 0\.05 -> 0\.1\); "
        r"accept them with --allow-change optim\.dense_lr, or start over with --restart$",
    )
    assert {name: (run / name).read_bytes() for name in record} == record

    # The run records which device drew its initial weights; a resume keeps its first start's (a
    # GPU's here, as if it started on one): export tells the rows that never trained by it.
    drew = run / "initial_weights.json"
    assert json.loads(drew.read_text()) == {"device": "cpu", "seed": 0, "torch": torch.__version__}
    drew.write_text('{"device": "cuda", "seed": 0}')
    # An allowed change resumes from step 10 and records the new settings (the ranks get the
    # --allow-change keys too: they would refuse the change otherwise).
    resumed = train_in_process(
        tiny_dataset,
        run,
        "--steps",
        "12",
        "--set",
        "optim.dense_lr=0.1",
        "--allow-change",
        "optim.dense_lr",
    )
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["resumed_from_step"] == 10
    assert "dense_lr = 0.1" in (run / "config.toml").read_text()
    assert json.loads(drew.read_text())["device"] == "cuda"

    # --restart: the old run moves to run.1 untouched, a new one starts on the other data.
    restarted = train_in_process(other, run, "--steps", "2", "--restart")
    assert restarted.exit_code == 0, restarted.output
    assert f"moved the earlier run {run} to {tmp_path / 'run.1'}" in restarted.stderr
    assert json.loads((tmp_path / "run.1" / "summary.json").read_text())["steps"] == 12
    assert (
        json.loads(restarted.stdout)["steps"] == 2
        and json.loads(restarted.stdout)["resumed_from_step"] is None
    )
    assert json.loads(drew.read_text())["device"] == "cpu"

    # eval: the data at the new run's data.path (other) changed since training: refused, unless
    # --data asks for other data, which must have the run's schema. (The module's dataset, run.1's,
    # stays as it is: the other test copies the module's run too.)
    write_tiny_dataset(other, seed=7)
    changed_data = CliRunner().invoke(app, ["eval", str(run), "--split", "val"])
    assert_one_line_error(
        changed_data,
        rf"^error: {run} was trained on other data than {other} now "
        rf"holds \(fingerprint [0-9a-f]{{12}}; the data there is [0-9a-f]{{12}}\): to evaluate "
        rf"on this data all the same, pass --data {other}$",
    )
    narrow = tmp_path / "narrow"
    write_tiny_dataset(narrow, cardinalities=(50, 300, 7, 999))
    schema = CliRunner().invoke(
        app, ["eval", str(tmp_path / "run.1"), "--split", "val", "--data", str(narrow)]
    )
    assert_one_line_error(
        schema,
        rf"^error: --data {narrow}: feature f3: 999 rows here, 1,000 rows in the data "
        rf"{tmp_path / 'run.1'} trained on$",
    )
    on_other = CliRunner().invoke(
        app, ["eval", str(tmp_path / "run.1"), "--split", "val", "--data", str(other), "--json"]
    )
    assert on_other.exit_code == 0, on_other.output
    scored = json.loads(on_other.stdout)
    assert (
        scored["data"] == str(other) and scored["step"] == 12 and scored["samples"] == 2 * 64
    )  # eval.max_batches = 2

    # shardrec runs: both runs complete with their step and best val AUC; a run that never
    # checkpointed (a config.toml alone) failed.
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.toml").write_text("")
    listed = CliRunner().invoke(app, ["runs", str(tmp_path), "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {Path(r["run"]).name: r for r in json.loads(listed.stdout)}
    assert {name: (r["step"], r["status"]) for name, r in rows.items()} == {
        "broken": (None, "failed"),
        "run": (2, "complete"),
        "run.1": (12, "complete"),
    }
    assert 0.4 < rows["run.1"]["best_val_auc"] <= 1
    table = CliRunner().invoke(app, ["runs", str(tmp_path)])
    assert table.exit_code == 0 and "complete" in table.stdout and "failed" in table.stdout, (
        table.stdout
    )


def test_the_readme_run_directory_examples_as_written_past_an_epoch_and_onto_more_ranks(
    trained: tuple[Path, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """README's tour, scaled to the tiny dataset (15 steps an epoch): --steps 10 (the module's run),
    the same command, --steps 20 (into the second epoch), a new world size with a plan made for it,
    a changed setting. Rank 0 says a resume's changed settings (on this process's stderr: the
    ranks write there, not to the runner's)."""
    tiny_dataset, run = _copy_run(trained, tmp_path)
    again = train_in_process(tiny_dataset, run, "--steps", "10")
    assert again.exit_code == 0 and again.stderr.strip() == (
        f"{run} is complete: 10 steps (train.steps = 10); nothing to do. "
        "To continue it, raise --steps (or train.epochs); to start over, add --restart"
    )
    capfd.readouterr()
    further = train_in_process(tiny_dataset, run, "--steps", "20")
    assert further.exit_code == 0, further.output
    assert (
        f"{run}: resuming from step 10 with changed settings: train.steps: 10 -> 20"
        in capfd.readouterr().err
    )
    summary = json.loads(further.stdout)
    assert (summary["steps"], summary["epochs"], summary["resumed_from_step"]) == (20, 1, 10)

    # Another world size in one command: a plan made for it is taken without --allow-change.
    plan = tmp_path / "w2.json"
    planned = CliRunner().invoke(
        app,
        [
            "plan",
            "--data",
            str(tiny_dataset),
            "--world-size",
            "2",
            "--out",
            str(plan),
            *LIFECYCLE_JOB,
        ],
    )
    assert planned.exit_code == 0, planned.output
    wider = train_in_process(
        tiny_dataset, run, "--steps", "25", "--nproc-per-node", "2", "--plan", str(plan)
    )
    assert wider.exit_code == 0, wider.output
    assert (
        f"{run}: resuming from step 20 with changed settings: sharding.plan: '' -> '{plan}', train.steps: 20 -> 25"
        in capfd.readouterr().err
    )
    summary = json.loads(wider.stdout)
    assert (summary["steps"], summary["world_size"], summary["resumed_from_step"]) == (25, 2, 20)

    changed = train_in_process(tiny_dataset, run, "--steps", "30", "--set", "optim.dense_lr=0.1")
    assert_one_line_error(
        changed,
        rf"^error: {run}: resuming with changed settings \(optim\.dense_lr: 0\.05 -> 0\.1\); accept them "
        r"with --allow-change optim\.dense_lr, or start over with --restart$",
    )

    # Back to 1 rank under a constraint that needs 2 (two 4-wide column shards on distinct ranks):
    # refused before any rank starts, naming the way on, which works.
    metrics = (run / "metrics.jsonl").read_bytes()
    pinned = 'sharding.constraints={t_f3={sharding_types=["column_wise"], min_partition=4}}'
    narrower = train_in_process(tiny_dataset, run, "--steps", "26", "--set", pinned)
    line = assert_one_line_error(
        narrower,
        r"^error: --set '.*': sharding\.constraints\.t_f3: no sharding type satisfies the "
        r"constraint "
        r"\(sharding_types \['column_wise'\], ranks all, min_partition 4, embedding_dim 8, world "
        r"size 1\); change or drop it for this world size \(--set 'sharding\.constraints=\{\}' drops "
        r"them all; a run resumes under any constraints\)$",
    )
    assert (run / "metrics.jsonl").read_bytes() == metrics  # no rank started
    hint = line.split("(--set '")[1].split("'")[0]
    on_one = train_in_process(tiny_dataset, run, "--steps", "26", "--set", pinned, "--set", hint)
    assert on_one.exit_code == 0, on_one.output
    assert json.loads(on_one.stdout)["world_size"] == 1


def test_a_checkpoint_copied_in_from_another_run_is_refused(
    trained: tuple[Path, Path], tmp_path: Path
) -> None:
    """Another run on the same data and model (here with another dense rate) saved step 12; its
    checkpoint copied among this run's would be the newest, and a resume would go on from that
    run's weights without a word. A copy of a whole run directory (the other tests' _copy_run)
    keeps its run's id and resumes."""
    data, run = _copy_run(trained, tmp_path)
    other = tmp_path / "other"
    assert (
        train_in_process(data, other, "--steps", "12", *settings("optim.dense_lr=0.5")).exit_code
        == 0
    )
    shutil.copytree(other / "checkpoints" / "step-00000012", run / "checkpoints" / "step-00000012")
    resumed = train_in_process(data, run, "--steps", "14")
    assert resumed.exit_code == 1, resumed.output  # before: trained on from the other run's step 12
    ids = [(r / "run_id").read_text().strip()[:12] for r in (other, run)]
    assert_one_line_error(
        resumed,
        "^"
        + re.escape(
            f"error: {run}/checkpoints/step-00000012: checkpoint of "
            f"another run (run {ids[0]}; this run directory is run {ids[1]}): resuming from it "
            "would go on from that run's weights and state; refusing the checkpoint; a re-run "
            "resumes from that checkpoint again; to resume from the one before it, "
            f"{run}/checkpoints/step-00000010 (step 10), move {run}/checkpoints/step-00000012 out "
            f"of {run}/checkpoints, or start over with --restart"
        )
        + "$",
    )
