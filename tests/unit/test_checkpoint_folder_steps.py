"""A checkpoint folder named for another step than it holds (`cp -r step-00000004 step-00000012`,
or `mv` in its place): `shardrec runs` says so, and `train`, a plain torchrun's ranks, `eval` and
`export` refuse it before any rank starts, in one line naming both steps and what to do (the step
read from its train_state.pt without torch)."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from conftest import write_tiny_dataset
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.tools.cli.app import app
from shardrec.tools.cli.train_run_dir import check_no_misnamed_checkpoint
from shardrec.trainer.rundir.checkpoint.folders import check_checkpoint_folders

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run-killed-at-step-6"
"""A run of 2 ranks killed after step 6, its one checkpoint of step 4 (tests/fixtures/README.md)."""


def _run(tmp_path: Path, how: str) -> tuple[Path, Path]:
    """The fixture run (its metrics an hour old: no job writes it) with its checkpoint of step 4
    copied or moved (`how`) to step-00000012; the run and that folder."""
    run = tmp_path / "runs" / how
    shutil.copytree(FIXTURE, run)
    hour_ago = time.time() - 3600
    os.utime(run / "metrics.jsonl", (hour_ago, hour_ago))
    checkpoints = run / "checkpoints"
    (shutil.copytree if how == "copied" else shutil.move)(
        checkpoints / "step-00000004", checkpoints / "step-00000012"
    )
    return run, checkpoints / "step-00000012"


def _line(folder: Path, how: str) -> str:
    """What every command says of `folder`, step-00000012 holding step 4."""
    todo = (
        f"copied by hand? step-00000004 is there too); move step-00000012 out of {folder.parent}"
        if how == "copied"
        else f"renamed by hand?); rename it step-00000004, or move it out of {folder.parent}"
    )
    return (
        f"{folder / 'train_state.pt'}: holds the checkpoint of step 4, not of step 12 as its "
        f"folder's name says ({todo}"
    )


def test_runs_says_a_run_whose_checkpoint_took_another_steps_name_is_misnamed(tmp_path: Path):
    # Before: both runs were listed at step 12 as "failed"; the copy had a line below the table
    # (the same files as step-00000004), the moved folder none.
    copied, copy = _run(tmp_path, "copied")
    moved, folder = _run(tmp_path, "moved")
    listed = CliRunner().invoke(app, ["runs", str(tmp_path / "runs"), "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {Path(r["run"]).name: r for r in json.loads(listed.stdout)}
    assert [(rows[n]["step"], rows[n]["status"]) for n in ("copied", "moved")] == [
        (12, "misnamed"),
        (12, "misnamed"),
    ]
    assert rows["moved"]["misnamed_checkpoints"] == [str(folder)]
    shown = CliRunner().invoke(app, ["runs", str(tmp_path / "runs")])
    assert shown.stdout.splitlines()[-2:] == [
        f"misnamed: {_line(copy, 'copied')}",
        f"misnamed: {_line(folder, 'moved')}",
    ]
    assert "copied:" not in shown.stdout  # the copy is said once


@pytest.mark.parametrize("how", ["copied", "moved"])
def test_train_and_a_plain_torchruns_ranks_refuse_it_before_any_rank_starts(
    tmp_path: Path, how: str
):
    # Before: `shardrec train --steps 8` said "has trained 12 steps, more than the 8 this job runs
    # to"; with --steps 16 the ranks refused it after torchrun and torchrec started (~30 s), and
    # of the moved folder said "no earlier checkpoint: start over with --restart".
    run, folder = _run(tmp_path, how)
    refused = CliRunner().invoke(app, ["train", "--out-dir", str(run), "--steps", "8"])
    line = _line(folder, how)
    assert_one_line_error(
        refused, "^" + re.escape(f"error: {line}; or start over with --restart") + "$"
    )
    with pytest.raises(ValueError) as ranks:  # what each rank of a plain torchrun checks first
        check_checkpoint_folders(run)
    assert str(ranks.value) == line
    assert folder.is_dir() and (how == "moved") != (run / "checkpoints/step-00000004").is_dir()


@pytest.mark.parametrize("checkpoint", [[], ["--checkpoint", "12"]])
def test_eval_and_export_of_a_moved_checkpoint_say_to_rename_it(tmp_path: Path, checkpoint):
    # Before: eval refused it once its ranks had started, export after reading it with torch,
    # both saying "export another checkpoint with --checkpoint STEP (this run has no other
    # checkpoint)" and not how to read this one.
    run, folder = _run(tmp_path, "moved")
    line = "^" + re.escape(f"error: {_line(folder, 'moved')}") + "$"
    eval_args = ["eval", str(run), "--device", "cpu", "--nproc-per-node", "1"]
    assert_one_line_error(CliRunner().invoke(app, [*eval_args, *checkpoint]), line)
    out = tmp_path / "model.safetensors"
    exported = CliRunner().invoke(app, ["export", str(run), "--out", str(out), *checkpoint])
    assert_one_line_error(exported, line)
    assert not out.exists()


def _checkpoint_of(run: Path, step: int, held: int) -> Path:
    """step-NNNNNNNN of `step` beside the fixture's step 4: its files, train_state.pt holding step
    `held`, digests.json written anew as a save writes it (`held` == `step`: a sound checkpoint)."""
    import torch

    from shardrec.trainer.rundir.checkpoint.trust import write_digests

    folder = run / "checkpoints" / f"step-{step:08d}"
    shutil.copytree(run / "checkpoints" / "step-00000004", folder)
    state = torch.load(folder / "train_state.pt", weights_only=True)
    state["progress"]["step"] = held
    torch.save(state, folder / "train_state.pt")
    (folder / "digests.json").unlink()
    write_digests(folder)
    return folder


def test_an_older_folder_named_for_another_step_beside_a_sound_newest_is_not_read(tmp_path):
    # Before: `cp -a step-00000004 step-00000006` beside a sound step 8, and eval, export and
    # train refused the run ("...step-00000006/train_state.pt: holds the checkpoint of step 4, not
    # of step 6 ...; or evaluate or export .../step-00000008 with --checkpoint 8"), though they
    # read step 8. Named, the folder is still refused.
    run, copy = _run(tmp_path, "copied")
    copy.rename(copy.with_name("step-00000006"))
    _checkpoint_of(run, 8, 8)
    write_tiny_dataset(tmp_path / "data")  # the fixture's data, which export reads the shape of
    out = tmp_path / "model.safetensors"
    export = ["export", str(run), "--out", str(out), "--data", str(tmp_path / "data")]
    exported = CliRunner().invoke(app, export)
    assert exported.exit_code == 0, exported.output
    assert f"wrote {out}: step 8, " in exported.stdout
    check_checkpoint_folders(run)  # train's ranks (and `shardrec train`) resume from step 8
    listed = json.loads(CliRunner().invoke(app, ["runs", str(run.parent), "--json"]).stdout)
    assert [(r["status"], r["misnamed_checkpoints"]) for r in listed] == [
        ("failed", [str(run / "checkpoints" / "step-00000006")])
    ]
    named = CliRunner().invoke(app, [*export, "--checkpoint", "6"])
    assert_one_line_error(named, "holds the checkpoint of step 4, not of step 6 ")


@pytest.mark.parametrize(("step", "held"), [(10, 4), (6, 12)])
def test_a_folder_that_would_be_taken_for_the_newest_is_refused_beside_a_sound_one(
    tmp_path, step, held
):
    # Named as the newest (step 10 holding 4), it would be read as the newest; holding a step past
    # the newest name's (step 6 holding 12), reading step 8 would pass over the user's newest.
    run, _ = _run(tmp_path, "copied")
    shutil.rmtree(run / "checkpoints" / "step-00000012")
    _checkpoint_of(run, 8, 8)
    folder = _checkpoint_of(run, step, held)
    line = f"{folder / 'train_state.pt'}: holds the checkpoint of step {held}, not of step {step} "
    out = tmp_path / "model.safetensors"
    exported = CliRunner().invoke(app, ["export", str(run), "--out", str(out)])
    assert_one_line_error(exported, "^error: " + re.escape(line))
    with pytest.raises(ValueError, match="^" + re.escape(line)):
        check_checkpoint_folders(run)
    assert not out.exists()


def test_a_folder_not_named_for_a_step_stops_only_what_would_pass_over_it(tmp_path: Path):
    # Before: `cp -a step-00000008 step-00000008.bak` (or `step-4`, a copy of step 4) beside the
    # sound newest step 8, and train, eval and export refused the run ("...step-00000008.bak: a
    # checkpoint's files in a folder not named step-NNNNNNNN, which no command reads ...; or
    # evaluate or export the newest named one, ... with --checkpoint 8"), though none reads it.
    # The user's newest renamed (step-8 holding step 8 beside step 4) is still refused.
    run, copy = _run(tmp_path, "copied")
    shutil.rmtree(copy)
    newest = _checkpoint_of(run, 8, 8)
    shutil.copytree(newest, newest.with_name("step-00000008.bak"))
    shutil.copytree(run / "checkpoints" / "step-00000004", run / "checkpoints" / "step-4")
    write_tiny_dataset(tmp_path / "data")
    out = tmp_path / "model.safetensors"
    export = ["export", str(run), "--out", str(out), "--data", str(tmp_path / "data")]
    exported = CliRunner().invoke(app, export)
    assert exported.exit_code == 0, exported.output
    assert f"wrote {out}: step 8, " in exported.stdout
    check_checkpoint_folders(run)  # train's ranks resume from step 8
    check_no_misnamed_checkpoint(run)  # and so does `shardrec train`: it starts them
    listed = json.loads(CliRunner().invoke(app, ["runs", str(run.parent), "--json"]).stdout)
    assert [(r["status"], r["misnamed_checkpoints"]) for r in listed] == [
        ("failed", [str(newest.with_name(n)) for n in ("step-00000008.bak", "step-4")])
    ]
    shutil.rmtree(newest.with_name("step-00000008.bak"))
    newest.rename(newest.with_name("step-8"))
    line = (
        f"{newest.with_name('step-8')}: a checkpoint's files in a folder not named step-NNNNNNNN, "
        f"which no command reads (renamed or copied by hand?); it holds step 8: rename it "
        f"step-00000008, or move it out of {newest.parent}"
    )
    refused = CliRunner().invoke(app, export)
    assert_one_line_error(refused, "^" + re.escape(f"error: {line}; or evaluate or export "))
    with pytest.raises(ValueError, match="^" + re.escape(line) + "$"):
        check_checkpoint_folders(run)
