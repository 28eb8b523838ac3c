"""Runs that `shardrec train` refuses or starts again, each on its own tiny run (README, "A run
directory has a life"): a resume that shortens the run is a change to accept; a run killed before
its first checkpoint is not rerun with other settings; --out-dir naming the dataset's directory (or
inside or around it) or another dataset is refused, and --restart moves only runs aside. The tours
of one trained run directory: test_run_lifecycle.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import assert_one_line_error
from run_dirs import train_in_process


def test_a_resume_that_shortens_the_run_is_a_change_to_accept(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    """Started with train.epochs = 3, stopped at step 5, rerun without it: epochs 3 -> 1 ends the
    run earlier, which the rerun must not do quietly (checked without training)."""
    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.trainer.job.config import load_job_config
    from shardrec.trainer.rundir.life import lifecycle

    run = tmp_path / "run"
    (run / "checkpoints" / "step-00000005").mkdir(parents=True)
    (run / "checkpoints" / "step-00000005" / "digests.json").write_text("{}")
    saved = load_job_config(
        None, [f'data.path="{tiny_dataset}"', "train.epochs=3", "train.global_batch_size=64"]
    )
    (run / "config.toml").write_text(saved.to_toml())
    manifest = Manifest.load(tiny_dataset)
    rerun = load_job_config(None, [f'data.path="{tiny_dataset}"', "train.global_batch_size=64"])
    with pytest.raises(ValueError) as refused:
        lifecycle.check_run_dir(run, rerun, manifest, [])
    assert str(refused.value) == (
        f"{run}: resuming with changed settings (train.epochs: 3 -> 1); accept them with "
        "--allow-change train.epochs, or start over with --restart"
    )
    assert lifecycle.check_run_dir(run, rerun, manifest, ["train.epochs"]) == "resume"
    assert (
        lifecycle.resume_notice(run, rerun)
        == f"{run}: resuming from step 5 with changed settings: train.epochs: 3 -> 1"
    )
    # Raising the end continues freely, and still says so; --steps past the epochs' end counts.
    longer = load_job_config(
        None, [f'data.path="{tiny_dataset}"', "train.global_batch_size=64", "train.steps=60"]
    )
    assert lifecycle.check_run_dir(run, longer, manifest, []) == "resume"
    assert lifecycle.planned_steps(longer, manifest) == 60


def test_a_run_stopped_before_its_first_checkpoint_is_not_rerun_with_other_settings(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    """Killed before its first checkpoint, a run starts again from step 0 and appends to its
    metrics.jsonl: with the same settings it logs the same lines again, with other settings the
    file would mix two runs' lines, so that is refused (checked without training)."""
    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.trainer.job.config import load_job_config
    from shardrec.trainer.rundir.life import lifecycle

    run = tmp_path / "run"
    run.mkdir()
    saved = load_job_config(None, [f'data.path="{tiny_dataset}"', "train.global_batch_size=64"])
    (run / "config.toml").write_text(saved.to_toml())
    (run / "metrics.jsonl").write_text(
        json.dumps({"kind": "train", "step": 20, "loss": 0.5}) + "\n"
    )
    manifest = Manifest.load(tiny_dataset)
    assert lifecycle.check_run_dir(run, saved, manifest, []) == "new"
    faster = load_job_config(
        None, [f'data.path="{tiny_dataset}"', "train.global_batch_size=64", "optim.dense_lr=0.5"]
    )
    with pytest.raises(ValueError) as refused:
        lifecycle.check_run_dir(run, faster, manifest, ["optim.dense_lr"])
    assert str(refused.value) == (
        f"{run}: holds a run that stopped before its first checkpoint (step 20 logged) with other "
        "settings (optim.dense_lr: 0.05 -> 0.5); start over with --restart, or rerun with its "
        "settings"
    )
    (run / "metrics.jsonl").write_text("")  # set up, never trained: nothing to mix
    assert lifecycle.check_run_dir(run, faster, manifest, []) == "new"


def test_a_run_directory_apart_from_the_dataset_and_restart_only_moves_runs(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    """--out-dir the dataset's directory (or inside it, or around it) is refused before anything
    is written: --restart would move the dataset aside with the run. --restart moves only a run."""
    for out, where in ((tiny_dataset, "is"), (tiny_dataset / "run", "is inside")):
        refused = train_in_process(tiny_dataset, out, "--steps", "2", "--restart")
        assert_one_line_error(
            refused,
            rf"^error: --out-dir {out} {where} the dataset directory {tiny_dataset}; give the run "
            "a directory of its own$",
        )
    assert (tiny_dataset / "manifest.json").is_file() and not (tiny_dataset / "run").exists()
    assert not (tiny_dataset / ".lock").exists()  # refused before the run directory's lock
    holder = tiny_dataset.parent
    assert_one_line_error(
        train_in_process(tiny_dataset, holder, "--steps", "2"),
        rf"^error: --out-dir {holder} holds the dataset directory {tiny_dataset}",
    )
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    assert_one_line_error(
        train_in_process(tiny_dataset, notes, "--steps", "2", "--restart"),
        rf"^error: --restart: {notes} holds files but no run \(no config.toml, metrics.jsonl or "
        r"checkpoints/\) and would be moved aside whole; give the run a directory of its own$",
    )
    assert (notes / "todo.txt").read_text() == "mine" and not (tmp_path / "notes.1").exists()


def test_another_dataset_as_the_run_directory_is_refused(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    """--out-dir naming another dataset (a slip between two folders) is refused before anything
    is written there: the run's files would land among its parts, and --restart would move that
    dataset aside, from under every run that trains on it."""
    other = tmp_path / "other"
    shutil.copytree(tiny_dataset, other)
    before = sorted(p.name for p in other.iterdir())
    for extra in ((), ("--restart",)):
        assert_one_line_error(
            train_in_process(tiny_dataset, other, "--steps", "2", *extra),
            rf"^error: --out-dir {other} is a dataset directory \(it holds manifest.json\); give "
            "the run a directory of its own$",
        )
    assert sorted(p.name for p in other.iterdir()) == before
    assert not (tmp_path / "other.1").exists()
