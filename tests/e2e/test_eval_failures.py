"""What `shardrec eval` shows when a checkpoint cannot be read or its ranks fail: a checkpoint file
cut short before its digests were written is refused in one line and exit code 1 before any rank
starts (no word of torchrun's, no second line of the launcher's); a crash (a bug's exception)
keeps its traceback and torchrun's word on the failed ranks, so that a real failure stays visible.
A good checkpoint is said to be evaluated, not resumed from."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_tiny_dataset
from helpers import assert_one_line_error, cli, no_rank_env, rank_site

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run-killed-at-step-6"
"""A run of 2 ranks with one checkpoint, step 4."""

_CRASH_IN_THE_RANKS = """
import os

if "LOCAL_RANK" in os.environ:  # eval's ranks, not the launcher nor torchrun's agent
    from shardrec.trainer.inference import evaluate

    def crash(*args, **kwargs):
        raise RuntimeError("a bug in the evaluation (planted by the test)")

    evaluate.evaluate_checkpoint = crash
"""


def _eval(tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`shardrec eval` of a copy of the fixture's run on 2 CPU ranks, as a user runs it."""
    run, data = tmp_path / "run", tmp_path / "data"
    if not run.exists():
        shutil.copytree(FIXTURE, run)
        write_tiny_dataset(data)
    return subprocess.run(
        [sys.executable, "-m", "shardrec.tools.cli", "eval", str(run), "--data", str(data),
         "--split", "val", "--device", "cpu", "--nproc-per-node", "2"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


def _cut(tmp_path: Path, name: str, empty: bool = False) -> Path:
    """A copy of the fixture's run whose checkpoint file `name` was cut short (to half, or to
    nothing where `empty`) before its digests were written (they match it: only reading it finds
    it out); the checkpoint's folder."""
    from shardrec.trainer.rundir.checkpoint.trust import write_digests

    checkpoint = tmp_path / "run" / "checkpoints" / "step-00000004"
    shutil.copytree(FIXTURE, tmp_path / "run")
    write_tiny_dataset(tmp_path / "data")
    cut = checkpoint / name
    cut.write_bytes(b"" if empty else cut.read_bytes()[: cut.stat().st_size // 2])
    write_digests(checkpoint)
    return checkpoint


def _refused_before_any_rank(tmp_path: Path) -> subprocess.CompletedProcess:
    """_eval of the copy in `tmp_path`, asserting that no rank started."""
    env, marker = no_rank_env(tmp_path)
    done = _eval(tmp_path, env)
    assert not marker.exists(), f"a rank started: {done.stderr[-3000:]}"
    return done


def test_a_cut_shard_is_the_one_line_eval_prints_before_any_rank_starts(tmp_path: Path) -> None:
    # Before: the refusal came from the ranks, once torchrun and torchrec had started (~10-30 s),
    # as '(__0_0.distcp: RuntimeError: ...)', DCP's error of the cut read.
    saved = (FIXTURE / "checkpoints" / "step-00000004" / "__0_0.distcp").stat().st_size
    checkpoint = _cut(tmp_path, "__0_0.distcp")  # its last item ends where the file did
    done = _refused_before_any_rank(tmp_path)
    assert (done.returncode, done.stdout) == (1, ""), done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    (line,) = lines
    assert line == (
        f"error: {checkpoint}: a file of this checkpoint is truncated or unreadable "
        f"(__0_0.distcp: {saved // 2:,} bytes, .metadata says {saved:,}), though it matches its "
        "digests (it was saved that way); evaluate or export another checkpoint with --checkpoint "
        "STEP; to resume training from an earlier one, move this folder aside (this run has no "
        "other checkpoint)"
    ), done.stderr


def test_eval_on_one_rank_says_1_rank(tmp_path: Path, monkeypatch) -> None:
    """Before: `(1 ranks, trained on 1)`. The ranks' work is stood in for: only the line is
    tested."""
    from shardrec.tools.cli import eval as eval_cli

    shutil.copytree(FIXTURE, tmp_path / "run")
    write_tiny_dataset(tmp_path / "data")
    metrics = {"step": 4, "split": "val", "world_size": 1, "trained_world_size": 1, "auc": 0.5,
               "logloss": 0.69, "ne": 1.0, "samples": 256, "seconds": 0.1}  # fmt: skip
    monkeypatch.setattr(eval_cli, "_evaluate", lambda request, nproc: metrics)
    shown = cli(
        "eval", tmp_path / "run", "--data", tmp_path / "data", "--split", "val",
        "--nproc-per-node", "1",
    )  # fmt: skip
    assert f"step 4 on val of {tmp_path / 'data'} (1 rank, trained on 1): AUC" in shown.stdout


@pytest.mark.slow
def test_eval_says_it_evaluates_the_checkpoint_not_that_it_resumed(tmp_path: Path) -> None:
    # Before: rank 0 logged 'resumed from .../step-00000004 (step 4, saved by 2 ranks, now 2)'.
    done = _eval(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint = tmp_path / "run" / "checkpoints" / "step-00000004"
    said = [line.split(": ", 1)[1] for line in done.stderr.splitlines() if "INFO" in line]
    assert said == [f"evaluating {checkpoint} (step 4, saved by 2 ranks, now 2) on val"], said


def test_a_cut_train_state_is_the_one_unreadable_line_of_eval_and_export(tmp_path: Path) -> None:
    # Before: eval gave the rank's traceback ('OSError: [Errno 22] Invalid argument') and
    # 'error: evaluation failed: rank 0 exited with code 1'; export said
    # '...safetensors: cannot write the model (Invalid argument)'.
    checkpoint = _cut(tmp_path, "train_state.pt")
    unreadable = (
        re.escape(f"error: {checkpoint}: a file of this checkpoint is truncated or unreadable (")
        + r"train_state\.pt: \w+: [^)]+"
        + re.escape("), though it matches its digests (it was saved that way); ")
    )
    others = re.escape(" (this run has no other checkpoint)")
    evaluated = _refused_before_any_rank(tmp_path)
    assert_one_line_error(
        evaluated,
        "^"
        + unreadable
        + re.escape(
            "evaluate or export another checkpoint with --checkpoint STEP; to resume training "
            "from an earlier one, move this folder aside"
        )
        + others
        + "$",
    )
    out = tmp_path / "model.safetensors"
    exported = cli("export", tmp_path / "run", "--data", tmp_path / "data", "--out", out, ok=False)
    assert_one_line_error(
        exported,
        "^"
        + unreadable
        + re.escape("export another checkpoint with --checkpoint STEP")
        + others
        + "$",
    )
    assert not out.exists()


def test_a_cut_metadata_is_the_one_unreadable_line_of_eval(tmp_path: Path) -> None:
    # Before: two of torch's 'WARNING root: ... metadata is not found' with their tracebacks came
    # first, from each rank; then the line's cause was torch's 'AssertionError: metadata is None;
    # global metadata read failed: pickle data was truncated; rank local metadata read failed:
    # [Errno 2] No such file or directory: '.../__0.metadata'', a file shardrec never writes.
    checkpoint = _cut(tmp_path, ".metadata")
    assert_one_line_error(
        _refused_before_any_rank(tmp_path),
        "^"
        + re.escape(
            f"error: {checkpoint}: a file of this checkpoint is truncated or unreadable "
            "(.metadata: UnpicklingError: pickle data was truncated), though it matches its "
            "digests (it was saved that way); evaluate or export another checkpoint with "
            "--checkpoint STEP; to resume training from an earlier one, move this folder aside "
            "(this run has no other checkpoint)"
        )
        + "$",
    )


def test_a_cut_metadata_is_the_one_unreadable_line_of_export(tmp_path: Path) -> None:
    # Before: export gave the traceback of 'UnpicklingError: pickle data was truncated'.
    checkpoint = _cut(tmp_path, ".metadata")
    out = tmp_path / "model.safetensors"
    exported = cli("export", tmp_path / "run", "--data", tmp_path / "data", "--out", out, ok=False)
    assert_one_line_error(
        exported,
        "^"
        + re.escape(
            f"error: {checkpoint}: a file of this checkpoint is truncated or unreadable "
            "(.metadata: UnpicklingError: pickle data was truncated), though it matches its "
            "digests (it was saved that way); export another checkpoint with --checkpoint STEP "
            "(this run has no other checkpoint)"
        )
        + "$",
    )
    assert not out.exists()


def test_a_failure_without_a_message_is_named_by_its_type(tmp_path: Path) -> None:
    # A shard cut to nothing: torch raises EOFError with no message, naming no file. Before:
    # '(EOFError: )', then '(EOFError)' without the file.
    checkpoint = _cut(tmp_path, "__0_0.distcp", empty=True)
    exported = cli(
        "export", tmp_path / "run", "--data", tmp_path / "data", "--out", tmp_path / "m", ok=False
    )
    assert_one_line_error(
        exported,
        "^"
        + re.escape(
            f"error: {checkpoint}: a file of this checkpoint is truncated or unreadable "
            "(__0_0.distcp: EOFError), though it matches its digests (it was saved that way); "
            "export another "
            "checkpoint with --checkpoint STEP (this run has no other checkpoint)"
        )
        + "$",
    )


@pytest.mark.slow
def test_a_crash_in_the_ranks_keeps_its_traceback_and_torchruns_word(tmp_path: Path) -> None:
    done = _eval(tmp_path, rank_site(tmp_path / "site", _CRASH_IN_THE_RANKS))
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" in done.stderr, done.stderr[-3000:]
    assert "RuntimeError: a bug in the evaluation (planted by the test)" in done.stderr
    lines = done.stderr.strip().splitlines()
    assert any(x.startswith("torchrun: ") for x in lines), done.stderr[-3000:]
    assert lines[-1].startswith("error: evaluation failed: rank"), lines[-1]
