"""A checkpoint damaged on disk as `shardrec train` and `shardrec eval` meet it (README, Failures
and trust: Training), on copies of one real run directory trained to step 4: a file cut short, a
checkpoint that lost its digests, a folder renamed by hand, a train_state cut under evaluation.
Each is refused in one line naming the file and the way out, never passed over or kept as the one
to resume from. A killed launcher and a run directory in use: test_train_launcher.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_tiny_dataset
from helpers import (
    TINY_CPU_JOB,
    assert_one_line_error,
    no_rank_env,
    train_command,
)


def _checkpointed(data: Path, run_dir: Path) -> list[str]:
    """Training on 1 rank with a checkpoint every 2 steps (give --steps)."""
    return train_command(
        data, run_dir, *TINY_CPU_JOB, "--set", "checkpoint.interval_steps=2", nproc=1
    )


@pytest.fixture(scope="module")
def trained_to_step_4(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A dataset and a run on it `_checkpointed` to step 4, made once for the tests that damage a
    checkpoint: each damages a copy (`_copy`)."""
    root = tmp_path_factory.mktemp("trained_to_step_4")
    write_tiny_dataset(root / "data")
    command = _checkpointed(root / "data", root / "run") + ["--steps", "4"]
    trained = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr[-3000:]
    return root / "data", root / "run"


def _copy(trained: tuple[Path, Path], tmp_path: Path) -> tuple[Path, list[str]]:
    """A copy of `trained_to_step_4`'s run in `tmp_path` and its `_checkpointed` command."""
    data, run = trained
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run", _checkpointed(data, tmp_path / "run")


@pytest.mark.slow
def test_eval_of_a_refused_checkpoint_names_the_file_last(
    trained_to_step_4: tuple[Path, Path], tmp_path: Path
):
    # Before: the rank's line went by and the last one said only "evaluation failed: rank 0
    # exited with code 1".
    run_dir, _ = _copy(trained_to_step_4, tmp_path)
    shutil.rmtree(run_dir / "checkpoints" / "step-00000002")  # the run's one checkpoint
    checkpoint = run_dir / "checkpoints" / "step-00000004"
    state = checkpoint / "train_state.pt"
    state.write_bytes(state.read_bytes()[:-1])
    env, marker = no_rank_env(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "shardrec.tools.cli", "eval", str(run_dir), "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 1, done.stderr[-3000:]
    # Refused before any rank starts, as train refuses it (before: once torchrun and torchrec had
    # started, ~10-30 s).
    assert not marker.exists(), f"a rank started: {done.stderr[-3000:]}"
    # The refusal is the one error line (db0c3b8): no launcher line after it.
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == (
        f"error: {state}: contents differ from the digest written at save time (changed since); "
        "refusing the checkpoint; evaluate or export another checkpoint with --checkpoint STEP; "
        "to resume training from an earlier one, move this folder aside (this run has no other "
        "checkpoint)"
    ), done.stderr[-3000:]
    assert [line for line in lines if line.startswith(("error:", "torchrun:"))] == lines[-1:], (
        done.stderr[-3000:]
    )


@pytest.mark.slow
def test_a_checkpoint_that_lost_its_digests_is_refused_not_skipped(
    trained_to_step_4: tuple[Path, Path], tmp_path: Path
):
    # A save cannot leave one (it renames the folder into place after digests.json): a copy or a
    # clean-up that did. Before: the run went back to step 2 without a word, and the re-save of
    # step 4 then replaced the folder.
    run_dir, command = _copy(trained_to_step_4, tmp_path)
    checkpoint = run_dir / "checkpoints" / "step-00000004"
    (checkpoint / "digests.json").unlink()
    rerun = subprocess.run(command + ["--steps", "6"], capture_output=True, text=True, timeout=300)
    assert_one_line_error(
        rerun,
        "^error: "
        + re.escape(
            f"{checkpoint}: no digests.json: not a complete checkpoint (a save writes it last and "
            "renames the folder into place after it: a copy or a clean-up left this one); to "
            f"resume from {run_dir / 'checkpoints' / 'step-00000002'} (step 2), move {checkpoint} "
            f"out of {checkpoint.parent}, or start over with --restart"
        )
        + "$",
    )
    assert (checkpoint / "train_state.pt").is_file()


@pytest.mark.slow
def test_a_checkpoint_folder_renamed_by_hand_is_refused_not_passed_over(
    trained_to_step_4: tuple[Path, Path], tmp_path: Path
):
    # Before: the newest checkpoint renamed step-4 was passed over without a word: the run went
    # back to step 2 (with none left, it started over beside it).
    run_dir, command = _copy(trained_to_step_4, tmp_path)
    renamed = run_dir / "checkpoints" / "step-4"
    (run_dir / "checkpoints" / "step-00000004").rename(renamed)
    rerun = subprocess.run(command + ["--steps", "6"], capture_output=True, text=True, timeout=300)
    assert_one_line_error(
        rerun,
        "^error: "
        + re.escape(
            f"{renamed}: a checkpoint's files in a folder not named step-NNNNNNNN, which no "
            "command reads (renamed or copied by hand?); it holds step 4: rename it "
            f"step-00000004, or move it out of {renamed.parent}; or start over with --restart"
        )
        + "$",
    )
    assert sorted(p.name for p in renamed.parent.iterdir()) == ["step-00000002", "step-4"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "cut, cause",
    [
        ("__0_0.distcp", r"__0_0\.distcp: [\d,]+ bytes, \.metadata says [\d,]+"),
        ("train_state.pt", r"train_state\.pt: \w+: [^)]+"),
        (".metadata", r"\.metadata: UnpicklingError: pickle data was truncated"),
    ],
    ids=["shard", "train_state", "metadata"],
)
def test_a_checkpoint_that_cannot_be_read_is_refused_with_the_way_out_not_kept(
    trained_to_step_4: tuple[Path, Path], tmp_path: Path, cut: str, cause: str
):
    # A file cut short before its digests were written (they match it): it cannot be read.
    # Before: the line ended 'the newest complete checkpoint, ... (step 4), is kept and a re-run
    # resumes from it', a rerun that fails the same way, after the rank's advice for eval; a cut
    # train_state.pt gave torch's traceback and 'rank 0: OSError: [Errno 22] Invalid argument', a
    # cut .metadata 'rank 0: UnpicklingError: pickle data was truncated', then that cause without
    # the file's name; and each came from rank 0 ('training failed: rank 0: ...'), once torchrun
    # and torchrec had started (~10-30 s).
    from shardrec.trainer.rundir.checkpoint.trust import write_digests

    run_dir, command = _copy(trained_to_step_4, tmp_path)
    checkpoint, before = (run_dir / "checkpoints" / f"step-0000000{s}" for s in (4, 2))
    shard = checkpoint / cut
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    write_digests(checkpoint)
    env, marker = no_rank_env(tmp_path)
    rerun = subprocess.run(
        command + ["--steps", "6"], capture_output=True, text=True, timeout=300, env=env
    )
    assert not marker.exists(), f"a rank started: {rerun.stderr[-3000:]}"
    # The refusal alone: before it, 'RUN: resuming from step 4 with changed settings: train.steps:
    # 4 -> 6' announced a resume that did not happen.
    assert_one_line_error(
        rerun,
        "^"
        + re.escape(f"error: {checkpoint}: a file of this checkpoint is truncated or unreadable (")
        + cause
        + re.escape(
            "), though it matches its digests (it was saved that way); refusing the checkpoint "
            "(this run's other checkpoints: steps 2); a re-run resumes from that checkpoint "
            f"again; to resume from the one before it, {before} (step 2), move {checkpoint} out "
            f"of {checkpoint.parent}, or start over with --restart"
        )
        + "$",
    )
