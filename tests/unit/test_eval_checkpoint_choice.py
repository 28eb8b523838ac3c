"""Which checkpoint `shardrec eval` and `shardrec export` read when the user names none: the
newest, never the one before it without a word; a newer folder that lost its digests.json (a copy
or a clean-up; a save cannot leave one) is refused in one line naming it, before any rank starts,
as `shardrec train` refuses it."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from conftest import write_tiny_dataset
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.tools.cli.app import app

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run-killed-at-step-6"
"""A run of 2 ranks with one checkpoint, step 4 (tests/fixtures/README.md)."""


def _run_whose_newest_lost_its_digests(tmp_path: Path) -> tuple[Path, Path]:
    """The fixture run with a step-6 folder (a copy of step 4's files) without digests.json; the
    run and its dataset."""
    write_tiny_dataset(tmp_path / "data")
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    checkpoints = run / "checkpoints"
    shutil.copytree(checkpoints / "step-00000004", checkpoints / "step-00000006")
    (checkpoints / "step-00000006" / "digests.json").unlink()
    return run, tmp_path / "data"


def test_eval_and_export_refuse_a_newest_checkpoint_without_digests(tmp_path: Path) -> None:
    # Before: eval evaluated step 4 (its line said "step 4", nothing about step 6).
    run, data = _run_whose_newest_lost_its_digests(tmp_path)
    checkpoints = run / "checkpoints"
    torn, before = checkpoints / "step-00000006", checkpoints / "step-00000004"
    line = re.escape(
        f"error: {torn}: no digests.json: not a complete checkpoint (a save writes it last and "
        "renames the folder into place after it: a copy or a clean-up left this one); evaluate "
        f"or export the one before it, {before}, with --checkpoint 4; or move {torn} out of "
        f"{checkpoints}"
    )
    evaluated = CliRunner().invoke(
        app, ["eval", str(run), "--data", str(data), "--device", "cpu", "--nproc-per-node", "1"]
    )
    assert_one_line_error(evaluated, f"^{line}$")
    out = tmp_path / "model.safetensors"
    exported = CliRunner().invoke(app, ["export", str(run), "--out", str(out), "--data", str(data)])
    assert_one_line_error(exported, f"^{line}$")
    assert not out.exists()
    assert sorted(p.name for p in torn.iterdir()) == sorted(
        p.name for p in before.iterdir() if p.name != "digests.json"
    )


def test_a_torn_newest_folder_with_no_complete_one_before_it_says_so(tmp_path: Path) -> None:
    run, data = _run_whose_newest_lost_its_digests(tmp_path)
    checkpoints = run / "checkpoints"
    shutil.rmtree(checkpoints / "step-00000004")
    torn = checkpoints / "step-00000006"
    evaluated = CliRunner().invoke(
        app, ["eval", str(run), "--data", str(data), "--device", "cpu", "--nproc-per-node", "1"]
    )
    assert_one_line_error(
        evaluated,
        re.escape(
            "a copy or a clean-up left this one); there is no complete checkpoint before it; or "
            f"move {torn} out of {checkpoints}"
        )
        + "$",
    )


def _run_copy(tmp_path: Path) -> Path:
    """The fixture run copied into tmp_path, beside a tiny dataset of its data's shape."""
    write_tiny_dataset(tmp_path / "data")
    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    return run


def _export_refused(run: Path, tmp_path: Path, line: str) -> None:
    """export of `run` fails with exactly `line` and writes no file."""
    out = tmp_path / "model.safetensors"
    exported = CliRunner().invoke(
        app, ["export", str(run), "--out", str(out), "--data", str(tmp_path / "data")]
    )
    assert_one_line_error(exported, "^" + re.escape(line) + "$")
    assert not out.exists()


def test_export_refuses_a_folder_that_holds_another_steps_checkpoint(tmp_path: Path) -> None:
    """step-00000006 holding step 4's files, digests and all (a copy): export wrote step 4's
    weights as 'step 6' (its header's source step); then it refused them once read with torch
    ("... (a copy or a cut-short overwrite left it); refusing the checkpoint; export another
    checkpoint with --checkpoint STEP ..."), eval once its ranks had started. Both name the copy
    and the checkpoint to read instead, torch-free, before any rank starts."""
    run = _run_copy(tmp_path)
    checkpoints = run / "checkpoints"
    copy = checkpoints / "step-00000006"
    shutil.copytree(checkpoints / "step-00000004", copy)
    line = (
        f"error: {copy / 'train_state.pt'}: holds the checkpoint of step 4, not of step 6 as its "
        f"folder's name says (copied by hand? step-00000004 is there too); move step-00000006 out "
        f"of {checkpoints}; or evaluate or export {checkpoints / 'step-00000004'} with "
        "--checkpoint 4"
    )
    _export_refused(run, tmp_path, line)
    evaluated = CliRunner().invoke(
        app, ["eval", str(run), "--data", str(tmp_path / "data"), "--checkpoint", "6"]
    )
    assert_one_line_error(evaluated, "^" + re.escape(line) + "$")


def test_export_of_a_changed_checkpoint_says_what_to_do(tmp_path: Path) -> None:
    """A file changed since the save: the refusal names it and says what to do, as a checkpoint
    that cannot be read does (train's refusal names the checkpoint to resume from instead)."""
    run = _run_copy(tmp_path)
    state = run / "checkpoints" / "step-00000004" / "train_state.pt"
    state.write_bytes(state.read_bytes()[:-1])
    _export_refused(
        run,
        tmp_path,
        f"error: {state}: contents differ from the digest written at save time (changed since); "
        "refusing the checkpoint; export another checkpoint with --checkpoint STEP (this run has "
        "no other checkpoint)",
    )


def test_eval_and_export_name_a_checkpoint_folder_renamed_by_hand(tmp_path: Path) -> None:
    # Before: --checkpoint 6 said "no complete checkpoint of step 6 (has steps 4)", not a word of
    # step-6. A copy of the newest step, it stops nothing that reads the newest: export reads step
    # 4 (the newest renamed is refused: test_checkpoint_folder_steps).
    run = _run_copy(tmp_path)
    checkpoints = run / "checkpoints"
    renamed, before = checkpoints / "step-6", checkpoints / "step-00000004"
    shutil.copytree(before, renamed)
    unread = (
        f"{renamed}: a checkpoint's files in a folder not named step-NNNNNNNN, which no command "
        "reads (renamed or copied by hand?); it holds step 4, as step-00000004 does (a copy): "
        f"move it out of {checkpoints}"
    )
    out = tmp_path / "model.safetensors"
    export = ["export", str(run), "--out", str(out), "--data", str(tmp_path / "data")]
    exported = CliRunner().invoke(app, export)
    assert exported.exit_code == 0 and f"wrote {out}: step 4, " in exported.stdout, exported.output
    evaluated = CliRunner().invoke(
        app, ["eval", str(run), "--data", str(tmp_path / "data"), "--checkpoint", "6"]
    )
    assert_one_line_error(
        evaluated,
        "^"
        + re.escape(f"error: {run}: no complete checkpoint of step 6 (has steps 4); {unread}")
        + "$",
    )


def test_a_renamed_checkpoint_is_named_with_the_step_it_holds(tmp_path: Path) -> None:
    # Before: "rename it step-NNNNNNNN, the 8-digit step it holds" for a folder named backup, and
    # "rename it step-00000006 if it holds step 6" for step-6 holding step 4 beside step-00000004
    # (the rename then refused as a copy): the step comes from its train_state.pt, torch-free.
    run = _run_copy(tmp_path)
    checkpoints = run / "checkpoints"
    (checkpoints / "step-00000004").rename(checkpoints / "backup")
    listed = CliRunner().invoke(app, ["runs", str(run.parent)])
    assert listed.stdout.splitlines()[-1] == (
        f"misnamed: {checkpoints / 'backup'}: a checkpoint's files in a folder not named "
        "step-NNNNNNNN, which no command reads (renamed or copied by hand?); it holds step 4: "
        f"rename it step-00000004, or move it out of {checkpoints}"
    )
