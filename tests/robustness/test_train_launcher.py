"""A killed launcher, two jobs on one run directory and a planted checkpoint, as `shardrec train`
meets them (README, Failures and trust: Training), on one real 2-rank run directory:

- a second job on a run directory in use is refused in one line naming the holder;
- SIGKILL of the launcher's whole process group takes the ranks with it (torchrun starts them
  in sessions of their own, out of that group's reach);
- a rerun on the same directory then trains;
- a checkpoint whose .metadata was replaced by a pickle that would run code is refused in one
  line naming the file, and the code never runs.

Checkpoints damaged otherwise (cut short, digests lost, renamed): test_train_damaged_checkpoints.py.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from dataset_writing import file_offset
from helpers import (
    TINY_CPU_JOB,
    assert_one_line_error,
    train_command,
    trainer_ranks,
)


def _command(data: Path, run_dir: Path, *extra: str, ranks: int = 2) -> list[str]:
    return train_command(data, run_dir, *TINY_CPU_JOB, *extra, nproc=ranks)


def _steps(data: Path, run_dir: Path, steps: int) -> subprocess.CompletedProcess:
    """Train to `steps` with a checkpoint every 2 steps; the finished process."""
    command = _command(data, run_dir, "--steps", str(steps), "--set", "checkpoint.interval_steps=2")
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


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
