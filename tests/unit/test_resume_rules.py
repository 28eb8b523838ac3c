"""What a resume may change: `--allow-change KEY` lets exactly that setting (or, for a section
name, that section's settings) differ from the run's config.toml, and nothing that merely starts
with the same letters."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from shardrec.dataloader.format.manifest import Manifest
from shardrec.trainer.job.config import load_job_config
from shardrec.trainer.rundir.lifecycle import check_run_dir, resume_notice


def _run_with_a_checkpoint(tmp_path: Path, config_toml: str) -> Path:
    run = tmp_path / "run"
    step = run / "checkpoints" / "step-00000004"
    step.mkdir(parents=True)
    (step / "digests.json").write_text("{}")  # what makes a checkpoint complete
    (run / "config.toml").write_text(config_toml)
    return run


def test_allowing_a_key_does_not_allow_keys_that_start_with_it(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    saved = load_job_config(None, [f'data.path="{tiny_dataset}"', "train.global_batch_size=64"])
    run = _run_with_a_checkpoint(tmp_path, saved.to_toml())
    manifest = Manifest.load(tiny_dataset)
    changed = dataclasses.replace(saved, optim=dataclasses.replace(saved.optim, sparse_lr=0.1))
    refused = r"changed settings \(optim.sparse_lr: 0.05 -> 0.1\); accept them with --allow-change optim.sparse_lr,"
    with pytest.raises(ValueError, match=refused):
        check_run_dir(run, changed, manifest, ["optim.sparse"])
    with pytest.raises(ValueError, match=refused):
        check_run_dir(run, changed, manifest, ["opt"])
    assert check_run_dir(run, changed, manifest, ["optim.sparse_lr"]) == "resume"
    assert check_run_dir(run, changed, manifest, ["optim"]) == "resume"  # the whole section
    assert check_run_dir(run, saved, manifest, []) == "resume"


def test_a_rerun_with_the_same_data_given_relative_announces_no_change(
    tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """config.toml keeps data.path absolute; the same command rerun from the same directory with
    `--data data` announced "changed settings: data.path: '/abs/data' -> 'data'"."""
    saved = load_job_config(
        None, [f'data.path="{tiny_dataset.resolve()}"', "train.global_batch_size=64"]
    )
    run = _run_with_a_checkpoint(tmp_path, saved.to_toml())
    monkeypatch.chdir(tiny_dataset.parent)
    rerun = load_job_config(
        None, [f'data.path="{tiny_dataset.name}"', "train.global_batch_size=64"]
    )
    assert check_run_dir(run, rerun, Manifest.load(tiny_dataset), []) == "resume"
    assert resume_notice(run, rerun) is None
    moved = load_job_config(None, ['data.path="elsewhere"', "train.global_batch_size=64"])
    assert resume_notice(run, moved) == (
        f"{run}: resuming from step 4 with changed settings: data.path: "
        f"{str(tiny_dataset.resolve())!r} -> {str(tiny_dataset.parent.resolve() / 'elsewhere')!r}"
    )
