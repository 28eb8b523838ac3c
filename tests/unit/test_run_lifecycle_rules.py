"""A run directory's life without torch (trainer/rundir/life/: lifecycle.py, resume_settings.py,
run_state.py, trained_data.py): whether a job is new, resumes or has nothing left to do, the one
line of each refusal and of a finished run. The status `shardrec runs` shows:
test_run_status.py. The trainer's side (checkpoints written by real runs):
tests/e2e/test_run_lifecycle.py."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from conftest import write_tiny_dataset
from run_dirs import job_config, run_dir_as_left

from shardrec.dataloader.format.fingerprints import dataset_fingerprint
from shardrec.dataloader.format.manifest import Manifest
from shardrec.trainer.job.config import JobConfig, load_job_config
from shardrec.trainer.rundir.life.lifecycle import (
    check_job,
    check_run_dir,
    move_aside,
    planned_steps,
    resume_notice,
)
from shardrec.trainer.rundir.life.resume_settings import check_allow_keys
from shardrec.trainer.rundir.life.run_state import (
    read_run_dir,
)
from shardrec.trainer.rundir.life.trained_data import (
    dataset_record,
    preprocessing,
    preprocessing_differences,
    read_dataset_record,
)

FIXTURE_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "run-killed-at-step-6"

# tiny_dataset's train split: 1,000 rows; batches of 64 are 15 steps an epoch (16 padded).


def test_the_steps_a_job_runs_to(tiny_dataset: Path) -> None:
    manifest = Manifest.load(tiny_dataset)
    assert planned_steps(job_config(tiny_dataset), manifest) == 15
    assert planned_steps(job_config(tiny_dataset, 'data.tail="pad"'), manifest) == 16
    assert planned_steps(job_config(tiny_dataset, "train.epochs=2"), manifest) == 30
    assert planned_steps(job_config(tiny_dataset, "train.steps=7"), manifest) == 7


def test_a_rerun_of_a_finished_run_says_so_and_how_to_continue(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    config = job_config(tiny_dataset)
    run = run_dir_as_left(tmp_path, config, 15, {"steps": 15})
    assert check_run_dir(run, config, Manifest.load(tiny_dataset), []) == "complete"
    assert check_job(run, config, []) == (
        f"{run} is complete: 15 steps (train.epochs = 1); nothing to do. To continue it, raise "
        "--steps (or train.epochs); to start over, add --restart"
    )
    longer = job_config(tiny_dataset, "train.steps=20")
    assert check_run_dir(run, longer, Manifest.load(tiny_dataset), []) == "resume"
    assert check_job(run, longer, []) is None


def test_a_run_stopped_at_its_target_auc_is_complete_until_the_target_is_raised(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    config = job_config(tiny_dataset, "train.target_auc=0.8")
    target = {"kind": "target", "step": 6, "split": "val", "auc": 0.81, "target_auc": 0.8}
    run = run_dir_as_left(tmp_path, config, 6, {"steps": 6, "target_reached": True}, [target])
    manifest = Manifest.load(tiny_dataset)
    assert read_run_dir(run).target == target
    assert check_run_dir(run, config, manifest, []) == "complete"
    assert check_job(run, config, []) == (
        f"{run} is complete: the target AUC was reached at step 6 (val AUC 0.81000 >= "
        "train.target_auc = 0.8); nothing to do. To continue it, raise or clear the target "
        "(--set train.target_auc=0 --allow-change train.target_auc); to start over, add --restart"
    )
    allow = ["train.target_auc"]
    raised = job_config(tiny_dataset, "train.target_auc=0.9")
    assert check_run_dir(run, raised, manifest, allow) == "resume"
    assert check_run_dir(run, job_config(tiny_dataset), manifest, allow) == "resume"


def test_a_job_shorter_than_the_run_is_refused_in_one_line(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    run = run_dir_as_left(tmp_path, job_config(tiny_dataset, "train.steps=20"), 12)
    with pytest.raises(ValueError) as caught:
        check_run_dir(
            run, job_config(tiny_dataset, "train.steps=10"), Manifest.load(tiny_dataset), []
        )
    assert str(caught.value) == (
        f"{run} has trained 12 steps, more than the 10 this job runs to (train.steps / "
        "train.epochs): a run cannot go back; raise --steps, or start over with --restart"
    )


def test_raising_the_steps_continues_a_run_and_lowering_them_is_a_change(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    manifest = Manifest.load(tiny_dataset)
    run = run_dir_as_left(tmp_path, job_config(tiny_dataset, "train.steps=20"), 12)
    assert check_run_dir(run, job_config(tiny_dataset, "train.steps=30"), manifest, []) == "resume"
    with pytest.raises(ValueError) as caught:
        check_run_dir(run, job_config(tiny_dataset, "train.steps=14"), manifest, [])
    assert str(caught.value) == (
        f"{run}: resuming with changed settings (train.steps: 20 -> 14); accept them with "
        "--allow-change train.steps, or start over with --restart"
    )
    plan = job_config(tiny_dataset, "train.steps=20", 'sharding.plan="other.json"')
    assert check_run_dir(run, plan, manifest, []) == "resume"  # a checkpoint reshards
    constrained = dataclasses.replace(
        plan,
        sharding=dataclasses.replace(plan.sharding, constraints={"t_f0": {"min_partition": 4}}),
    )
    assert check_run_dir(run, constrained, manifest, []) == "resume"


def test_a_run_written_before_resumes_on_its_data_moved_elsewhere(tmp_path: Path) -> None:
    """The fixture run (tests/fixtures/README.md) trained on write_tiny_dataset's defaults at
    another path, in the layout before one file per part: once that data is upgraded, today's
    record of it is the one the run kept, fingerprint and schema, and the run resumes on the data
    at its new path without --allow-change."""
    from dataset_writing import write_old_layout

    from shardrec.tools.preprocess.derived.dataset_upgrade import upgrade_dataset

    write_tiny_dataset(tmp_path / "new")
    write_old_layout(tmp_path / "new", tmp_path / "data")
    upgrade_dataset(tmp_path / "data")
    manifest = Manifest.load(tmp_path / "data")
    kept = json.loads((FIXTURE_RUN / "dataset.json").read_text())
    ours = json.loads(dataset_record(kept["path"], manifest, given="data"))
    assert {key: ours[key] for key in kept} == kept  # the fixture predates "preprocessing"
    run = tmp_path / "run"
    shutil.copytree(FIXTURE_RUN, run)
    saved = load_job_config(run / "config.toml")
    moved = dataclasses.replace(
        saved, data=dataclasses.replace(saved.data, path=str(tmp_path / "data"))
    )
    assert check_run_dir(run, moved, manifest, []) == "resume"


def test_a_run_without_a_checkpoint_or_a_config_announces_no_change(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    config = job_config(tiny_dataset, "train.steps=20")
    run = run_dir_as_left(tmp_path, config, 12)
    assert resume_notice(run, job_config(tiny_dataset, "train.steps=30")) is not None
    (run / "config.toml").unlink()
    assert resume_notice(run, job_config(tiny_dataset, "train.steps=30")) is None
    (run / "config.toml").write_text(config.to_toml())
    shutil.rmtree(run / "checkpoints")
    assert resume_notice(run, job_config(tiny_dataset, "train.steps=30")) is None


def test_the_preprocessing_settings_include_the_feature_spec(tiny_dataset: Path) -> None:
    manifest = Manifest.load(tiny_dataset)
    manifest.options.update(spec_sha256="ab" * 32, mode="hash", max_ids=1000)
    settings = preprocessing(manifest)
    assert settings["cardinalities"] == [50, 300, 7, 1000]
    assert settings["spec_sha256"] == "ab" * 32 and settings["max_ids"] == 1000
    assert settings["min_count"] is None
    assert json.loads(dataset_record("/d", manifest))["preprocessing"] == settings


def test_a_run_on_changed_data_is_refused_naming_both_fingerprints(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    config = job_config(tiny_dataset)
    manifest = Manifest.load(tiny_dataset)
    run = run_dir_as_left(tmp_path, config, 4)
    (run / "dataset.json").write_bytes(dataset_record(str(tiny_dataset), manifest))
    assert check_run_dir(run, config, manifest, []) == "resume"
    changed = dataclasses.replace(manifest, dense_features=["a", "b", "c", "d"])
    ours, theirs = dataset_fingerprint(manifest), dataset_fingerprint(changed)
    with pytest.raises(ValueError) as caught:
        check_run_dir(run, config, changed, [])
    assert str(caught.value) == (
        f"{run} was trained on other data ({tiny_dataset}, fingerprint {ours[:12]}; this "
        f"dataset's is {theirs[:12]}): a run cannot resume on a changed dataset; to train the "
        f"run on it as new data (the next day's), give --continue-on {tiny_dataset} in place of "
        "--data; or start over with --restart or use another --out-dir"
    )


def test_the_dataset_record_keeps_the_path_given_and_the_fingerprint(tiny_dataset: Path) -> None:
    manifest = Manifest.load(tiny_dataset)
    record = json.loads(dataset_record("/abs/data", manifest, given="data"))
    assert record["path"] == "/abs/data" and record["given"] == "data"
    assert record["fingerprint"] == dataset_fingerprint(manifest)
    assert record["schema"]["sparse"] == [
        ["f0", 50, False],
        ["f1", 300, False],
        ["f2", 7, False],
        ["f3", 1000, False],
    ]
    assert json.loads(dataset_record("/abs/data", manifest))["given"] == "/abs/data"


def test_a_torn_or_foreign_dataset_record_is_no_record(tmp_path: Path) -> None:
    assert read_dataset_record(tmp_path) is None
    (tmp_path / "dataset.json").write_text('{"path": "/d", "fingerp')
    assert read_dataset_record(tmp_path) is None
    (tmp_path / "dataset.json").write_text("[1, 2]")
    assert read_dataset_record(tmp_path) is None


def test_the_fingerprint_follows_the_files_not_the_options(tiny_dataset: Path) -> None:
    manifest = Manifest.load(tiny_dataset)
    base = dataset_fingerprint(manifest)
    assert dataset_fingerprint(dataclasses.replace(manifest, options={"x": 1})) == base
    parts = manifest.splits["val"].parts
    parts[0] = dataclasses.replace(parts[0], sha256="0" * 64)
    assert dataset_fingerprint(manifest) != base


def test_preprocessing_differences_name_the_first_differing_table() -> None:
    trained = {"cardinalities": [50, 300, 7], "hash": True, "mode": "hash"}
    here = {"cardinalities": [50, 301, 8], "hash": False, "mode": "hash"}
    assert preprocessing_differences(trained, here) == (
        "cardinalities[1]: 300 in training, 301 here, hash: true in training, false here"
    )
    assert preprocessing_differences(trained, dict(trained)) == ""
    assert preprocessing_differences({"mode": "hash"}, {"mode": "vocab", "oov_id": 0}) == (
        "mode: 'hash' in training, 'vocab' here, oov_id: null in training, 0 here"
    )


def test_an_unknown_allow_change_key_is_refused_with_the_nearest_setting() -> None:
    with pytest.raises(ValueError) as caught:
        check_allow_keys(["optim.sparse_l"])
    assert (
        str(caught.value)
        == "--allow-change optim.sparse_l: no such setting; did you mean optim.sparse_lr?"
    )
    with pytest.raises(ValueError) as caught:
        check_allow_keys(["zzzz"])
    assert str(caught.value) == (
        "--allow-change zzzz: no such setting (see `shardrec config defaults`)"
    )
    check_allow_keys(["optim", "train.steps"])  # a section, a setting


def test_a_job_without_data_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as caught:
        check_job(tmp_path / "run", JobConfig(), [])
    assert str(caught.value) == "no dataset: pass --data DIR or set data.path in the job file"


def test_starting_over_moves_the_old_run_to_the_first_free_name(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert move_aside(run) is None  # nothing there
    run.mkdir()
    assert move_aside(run) is None and run.is_dir()  # empty: nothing to keep
    for expected in ("run.1", "run.2"):
        run.mkdir(exist_ok=True)
        (run / "config.toml").write_text("x")
        assert move_aside(run) == tmp_path / expected
        assert (tmp_path / expected / "config.toml").read_text() == "x" and not run.exists()
