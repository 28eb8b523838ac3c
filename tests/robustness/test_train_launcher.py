"""A killed launcher, two jobs on one run directory and a planted checkpoint, as `shardrec train`
meets them (README, Failures and trust: Training), on one real 2-rank run directory:

- a second job on a run directory in use is refused in one line naming the holder;
- SIGKILL of the launcher's whole process group takes the ranks with it (torchrun starts them
  in sessions of their own, out of that group's reach);
- a rerun on the same directory then trains;
- a checkpoint whose .metadata was replaced by a pickle that would run code is refused in one
  line naming the file, and the code never runs.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import write_tiny_dataset
from dataset_writing import file_offset
from helpers import (
    TINY_MODEL,
    assert_one_line_error,
    no_rank_env,
    settings,
    train_command,
    trainer_ranks,
)

JOB = settings(
    'train.device="cpu"',  # CPU ranks (gloo) even on a GPU host: 2 ranks must not need 2 GPUs
    *TINY_MODEL,
    "train.global_batch_size=64",
    'data.eval_splits=["val"]',
    "train.log_interval=1000",
)


def _command(data: Path, run_dir: Path, *extra: str, ranks: int = 2) -> list[str]:
    return train_command(data, run_dir, *JOB, *extra, nproc=ranks)


def _steps(data: Path, run_dir: Path, steps: int) -> subprocess.CompletedProcess:
    """Train to `steps` with a checkpoint every 2 steps; the finished process."""
    command = _command(data, run_dir, "--steps", str(steps), "--set", "checkpoint.interval_steps=2")
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def _checkpointed(data: Path, run_dir: Path) -> list[str]:
    """Training on 1 rank with a checkpoint every 2 steps (give --steps)."""
    return _command(data, run_dir, "--set", "checkpoint.interval_steps=2", ranks=1)


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


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


class PlantedCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the ranks in /proc")
def test_ranks_die_with_their_launcher_and_a_run_dir_in_use_is_refused(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    # A long job (thousands of steps, no checkpoint) in a process group of its own, as a shell would
    # start it.
    first = subprocess.Popen(
        _command(tiny_dataset, run_dir, "--set", "train.epochs=10000"),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _wait_for(lambda: len(trainer_ranks(run_dir)) == 2, 120), (
            first.stderr.read() if first.poll() is not None else ""
        )
        second = subprocess.run(
            _command(tiny_dataset, run_dir, "--steps", "4"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert_one_line_error(
            second,
            rf"{re.escape(str(run_dir))} is in use by job \w+ on host "
            rf"{re.escape(socket.gethostname())}, pid {first.pid} ",
        )
        assert len(trainer_ranks(run_dir)) == 2, "the refused job must leave the running one alone"
        os.killpg(first.pid, signal.SIGKILL)
        assert _wait_for(lambda: not trainer_ranks(run_dir), 5), (
            f"ranks outlived their launcher: {trainer_ranks(run_dir)}"
        )
    finally:  # whatever failed, leave nothing running
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        for pid in trainer_ranks(run_dir):
            os.kill(pid, signal.SIGKILL)
        first.wait(timeout=30)

    rerun = _steps(tiny_dataset, run_dir, 4)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    checkpoint = run_dir / "checkpoints" / "step-00000004"
    assert (checkpoint / "digests.json").is_file()

    marker = tmp_path / "pwned"
    (checkpoint / ".metadata").write_bytes(pickle.dumps(PlantedCode(marker)))
    tampered = _steps(tiny_dataset, run_dir, 6)
    # A rerun would resume from the same checkpoint: the line names the one before it and how.
    before = run_dir / "checkpoints" / "step-00000002"
    line = assert_one_line_error(
        tampered, re.escape(str(checkpoint / ".metadata")) + ": contents differ from the digest"
    )
    assert line.endswith(
        f"; a re-run resumes from that checkpoint again; to resume from the one before it, {before} "
        f"(step 2), move {checkpoint} out of {checkpoint.parent}, or start over with --restart"
    ), line
    assert not marker.exists(), "the planted pickle ran"
    assert not trainer_ranks(run_dir)
    checkpoint.rename(tmp_path / "refused")
    moved = _steps(tiny_dataset, run_dir, 6)
    assert moved.returncode == 0, moved.stderr[-3000:]
    assert json.loads(moved.stdout)["resumed_from_step"] == 2


_REPORTS = (
    "from shardrec.trainer.distributed.rank_process import report_failure\n"
    "report_failure({!r})\nraise SystemExit(1)\n"
)
_DIES = "import os, signal\nos.kill(os.getpid(), signal.SIGBUS)\n"
_REFUSES = (
    "from shardrec.trainer.distributed.rank_process import exit_refused\nexit_refused({!r})\n"
)


def test_the_launcher_says_why_a_rank_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank's own reason (a dataset or checkpoint error), or else how it died (a signal)."""
    from shardrec.trainer.distributed.launch import launch

    (tmp_path / "reports.py").write_text(
        _REPORTS.format("data/train/part-00001.arrow: 12 bytes, manifest says 4 KB")
    )
    (tmp_path / "dies.py").write_text(_DIES)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    reported = launch([], 1, module="reports")
    assert (
        reported.code == 1
        and reported.cause == "rank 0: data/train/part-00001.arrow: 12 bytes, manifest says 4 KB"
    )
    died = launch([], 1, module="dies")
    assert died.code == 1 and died.cause.startswith("rank 0 was killed by SIGBUS (signal 7); ")


def test_a_file_in_the_working_directory_named_like_a_stdlib_module_is_not_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun and the ranks start as `python -m`, the current directory first on sys.path: a
    user's grp.py there (tarfile, which torch imports, imports grp) stopped every run in a
    traceback. They run with PYTHONSAFEPATH, as `python -P`."""
    from shardrec.trainer.distributed.launch import launch

    work, modules = tmp_path / "work", tmp_path / "modules"
    work.mkdir(), modules.mkdir()
    (work / "grp.py").write_text("raise RuntimeError('the user's grp.py was imported')\n")
    (modules / "runs.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    # no empty entry: Python reads one as the current directory, which is what is tested
    paths = [str(modules), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    monkeypatch.chdir(work)
    done = launch([], 1, module="runs")
    assert done.code == 0 and (tmp_path / "ran").is_file(), done


@pytest.mark.slow
def test_a_dataset_changed_under_a_running_training_is_named_last(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    """Another job rewrites a part under the run (truncated in place, as a rewrite starts): the
    rank reading it fails (SIGBUS on its memory map, or an error naming it), and the launcher's
    last line names the file, not only "training failed"."""
    run_dir = tmp_path / "run"
    job = subprocess.Popen(
        _command(tiny_dataset, run_dir, "--set", "train.epochs=3", "--set", "train.log_interval=1", ranks=1),
        # One thread (the launcher would give one rank every core): idle threads spin on the cores
        # the rest of the suite runs on.
        env={**os.environ, "SHARDREC_FAULT": "slow:1", "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    metrics = run_dir / "metrics.jsonl"
    assert _wait_for(lambda: metrics.is_file() and '"step": 2' in metrics.read_text(), 180), (
        job.stderr
    )
    # The tiny split is read in one gather per epoch: the second epoch (step 16) reads the part
    # again.
    dense = tiny_dataset / "train" / "part-00001.arrow"
    dense.write_bytes(dense.read_bytes()[:100])
    _, stderr = job.communicate(timeout=180)
    assert job.returncode == 1
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: training failed: rank 0"), stderr[-3000:]
    assert f"; the dataset changed under the training: {dense}: 100 bytes, manifest says" in last, (
        last
    )


@pytest.mark.slow
def test_a_dataset_changed_before_the_run_is_not_said_to_have_changed_under_it(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    """A label byte rewritten in place before the run (the file keeps its size, so the start-up
    checks pass): the rank reading it fails, and the last line says that the dataset had
    changed before the run started, not under the training."""
    from shardrec.dataloader.format.part_file import open_split

    at = file_offset(open_split(tiny_dataset, "train")[0].labels) + 5
    part = tiny_dataset / "train" / "part-00000.arrow"
    raw = bytearray(part.read_bytes())
    raw[at] = 7
    part.write_bytes(bytes(raw))
    written = (tiny_dataset / "manifest.json").stat().st_mtime
    os.utime(part, (written + 5, written + 5))  # later than the manifest, whatever the clock
    done = subprocess.run(
        _command(tiny_dataset, tmp_path / "run", ranks=1),
        capture_output=True,
        text=True,
        timeout=300,
    )
    last = assert_one_line_error(done, r"training failed: rank 0: .*")
    assert last.endswith(
        f"the dataset had changed before the run started: {part}: modified after the manifest "
        "was written"
    ), last
    assert "under the training" not in last


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


def test_a_rank_that_refuses_gives_the_one_line_and_a_crash_keeps_torchruns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A refusal (bad input, said in one line) is all the launcher shows, and torchrun's agent
    adds nothing; a crash keeps its traceback and the agent's line."""
    from shardrec.trainer.distributed.launch import launch

    refusal = "data: no split named val; preprocess with a validation day"
    (tmp_path / "refuses.py").write_text(_REFUSES.format(refusal))
    (tmp_path / "crashes.py").write_text("raise RuntimeError('a bug')\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    refused = launch([], 1, module="refuses")
    assert (refused.code, refused.refusal, refused.cause) == (1, refusal, f"rank 0: {refusal}")
    assert capfd.readouterr().err == ""  # no rank's line, no torchrun's: the launcher says it
    crashed = launch([], 1, module="crashes")
    assert crashed.code == 1 and crashed.refusal == ""
    err = capfd.readouterr().err
    assert "RuntimeError: a bug" in err and err.strip().splitlines()[-1] == (
        "torchrun: rank 0 failed first (exit code 1)"
    ), err


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


def test_trainer_ranks_keep_freed_memory_in_the_heap_unless_the_user_set_malloc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step frees and allocates the same few-MiB buffers each step; with glibc's default
    thresholds every step faulted them in again (~5,000 page faults a bf16 reference-model rank
    step). The ranks get RANK_MALLOC_ENV; a user's own MALLOC_ settings win."""
    from shardrec.trainer.distributed.launch import RANK_MALLOC_ENV, launch

    modules = tmp_path / "modules"
    modules.mkdir()
    seen = tmp_path / "seen.json"
    (modules / "malloc_env.py").write_text(
        "import json, os\n"
        f"open({str(seen)!r}, 'w').write(json.dumps("
        "{k: v for k, v in os.environ.items() if k.startswith('MALLOC_')}))\n"
    )
    paths = [str(modules), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    for name in RANK_MALLOC_ENV:
        monkeypatch.delenv(name, raising=False)
    assert launch([], 1, module="malloc_env").code == 0
    assert json.loads(seen.read_text()) == RANK_MALLOC_ENV
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    assert launch([], 1, module="malloc_env").code == 0
    assert json.loads(seen.read_text()) == {"MALLOC_TRIM_THRESHOLD_": "0"}
