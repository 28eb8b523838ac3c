"""A stop that keeps the work.

SIGTERM to `shardrec train` (Kubernetes and a plain `kill` signal the launcher; Slurm every process
of the job), or SIGINT to every process of its group and to the ranks (a terminal's Ctrl-C reaches
the launcher's process group; torchrun starts the ranks in sessions of their own): the ranks finish
the step, write a checkpoint and leave; the launcher's last line says so, its exit code is 75;
`shardrec runs` lists the run as stopped, and a rerun of the same command ends bitwise equal to an
uninterrupted run. A second signal to the launcher, or no end within checkpoint.stop_grace_s, ends
the job at once; a rank takes a repeat of the same signal within a second as the same request.

Three 2-rank trainings of 30 short steps and one resume; the interrupted ones sleep after every
step (fault `slow`) so that the signal lands mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import TINY_MODEL, final_weights, settings, torchelastic_folders, trainer_ranks
from typer.testing import CliRunner

from shardrec.tools.cli.app import app

JOB = settings(
    'train.device="cpu"',  # CPU ranks (gloo) even on a GPU host: 2 ranks must not need 2 GPUs
    *TINY_MODEL,
    "train.global_batch_size=64",
    "train.epochs=2",  # 30 steps: a stop lands at step 10, 15 or 20, and the rerun trains on
    'data.eval_splits=["val"]',
    "train.log_interval=1",
)
STOPPED = 75


def _command(data: Path, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "shardrec.tools.cli",
        "train",
        "--data",
        str(data),
        "--out-dir",
        str(run_dir),
    ]


def _train(data: Path, run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        _command(data, run_dir) + ["--nproc-per-node", "2", *JOB], capture_output=True, text=True
    )


def _start(
    data: Path, run_dir: Path, nproc: int = 2, slow: bool = True, tmpdir: Path | None = None
) -> subprocess.Popen:
    """A training in a process group of its own, as a shell starts a job, slowed after every
    step (`slow`), with `tmpdir` as its TMPDIR."""
    env = {**os.environ, "SHARDREC_FAULT": "slow:1"} if slow else dict(os.environ)
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    return subprocess.Popen(
        _command(data, run_dir) + ["--nproc-per-node", str(nproc), *JOB],
        start_new_session=True,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for_step(job: subprocess.Popen, run_dir: Path, step: int) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and job.poll() is None:
        records = (
            (run_dir / "metrics.jsonl").read_text() if (run_dir / "metrics.jsonl").is_file() else ""
        )
        if any(
            json.loads(line).get("step", 0) >= step
            for line in records.splitlines()
            if line.endswith("}")
        ):
            return
        time.sleep(0.1)
    job.kill()
    raise AssertionError(
        f"no step {step} in {run_dir}: {job.stderr.read()[-3000:] if job.stderr else ''}"
    )


def _stopped_line(job: subprocess.Popen, run_dir: Path) -> int:
    """Assert the job stopped with its checkpoint, saying so last; returns the step."""
    _, stderr = job.communicate(timeout=120)
    assert job.returncode == STOPPED, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    step = int(last.removeprefix("stopped at step ").partition(";")[0])
    assert last == f"stopped at step {step}; checkpoint written; rerun the same command to resume"
    assert (
        3 <= step < 30 and (run_dir / "checkpoints" / f"step-{step:08d}" / "digests.json").is_file()
    )
    assert not (run_dir / "summary.json").exists()
    listed = CliRunner().invoke(app, ["runs", str(run_dir), "--json"])
    assert [r["status"] for r in json.loads(listed.stdout)] == ["stopped"], listed.output
    return step


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the ranks in /proc")
def test_sigterm_and_ctrl_c_stop_after_a_checkpoint_and_the_rerun_is_bit_exact(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    reference = _train(tiny_dataset, tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr[-3000:]

    # SIGTERM to the launcher alone (Kubernetes, `kill PID`).
    run = tmp_path / "sigterm"
    job = _start(tiny_dataset, run)
    _wait_for_step(job, run, 3)
    os.kill(job.pid, signal.SIGTERM)
    _stopped_line(job, run)
    rerun = _train(tiny_dataset, run)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    for part in ("model", "fused_optim"):
        ref, resumed = final_weights(tmp_path / "reference", part), final_weights(run, part)
        assert ref.keys() == resumed.keys()
        assert all(torch.equal(ref[key], resumed[key]) for key in ref), part
    ref, resumed = (
        json.loads((d / "summary.json").read_text()) for d in (tmp_path / "reference", run)
    )
    assert resumed["steps"] == 30 and resumed["resumed_from_step"] < 30
    for metrics in (ref["eval"]["val"], resumed["eval"]["val"]):
        metrics.pop("seconds")
    assert ref["eval"] == resumed["eval"]

    # SIGINT to the launcher's process group (a terminal's Ctrl-C) and to every rank (Slurm).
    run = tmp_path / "sigint"
    job = _start(tiny_dataset, run)
    _wait_for_step(job, run, 3)
    ranks = trainer_ranks(run)
    assert len(ranks) == 2
    os.killpg(job.pid, signal.SIGINT)
    for pid in ranks:
        os.kill(pid, signal.SIGINT)
    _stopped_line(job, run)
    assert not trainer_ranks(run)


_IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
)


@pytest.mark.parametrize("second_signal", [True, False])
def test_a_second_signal_or_the_grace_period_ends_the_job_at_once(
    tmp_path: Path, second_signal: bool
) -> None:
    from shardrec.trainer.distributed.launch import _supervise

    lines: list[str] = []
    # Signals arrive while the launcher waits: from a helper process, as from outside.
    sender = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os, signal, time; time.sleep(1); os.kill({os.getpid()}, signal.SIGTERM); "
            + (f"time.sleep(1); os.kill({os.getpid()}, signal.SIGINT)" if second_signal else ""),
        ]
    )
    start = time.monotonic()
    result = _supervise(
        lambda: subprocess.Popen([sys.executable, "-c", _IGNORES_SIGTERM]),
        tmp_path / "stop",
        30.0 if second_signal else 2.0,
        lines.append,
    )
    sender.wait()
    assert time.monotonic() - start < 20
    assert result.code == -signal.SIGKILL and result.signal == "SIGTERM"
    assert result.forced == (
        "stopped at once by a second signal (SIGINT)"
        if second_signal
        else "stopped at once: no checkpoint within 2 s (checkpoint.stop_grace_s; raise it where a "
        "step and a checkpoint take longer)"
    )
    assert (tmp_path / "stop").exists() and lines == [
        f"SIGTERM: the ranks stop within 10 steps and write a checkpoint (within {30 if second_signal else 2} s, "
        "checkpoint.stop_grace_s); a second signal stops at once"
    ]
    assert (
        signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    )  # the launcher's handlers are gone again


_SUPERVISE_WITH_SIGINT_IGNORED = """
import os, signal, subprocess, sys
from pathlib import Path
from shardrec.trainer.distributed.launch import _supervise
signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a script's `shardrec train ... &` starts
sender = subprocess.Popen(
    [sys.executable, "-c", f"import os, signal, time; time.sleep(1); os.kill({os.getpid()}, 2)"]
)
stop = Path(sys.argv[1])
result = _supervise(
    lambda: subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"]),
    stop, 30.0, print,
)
sender.wait()
print(result.code, result.signal, stop.exists(), signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
"""


def test_a_launcher_started_with_sigint_ignored_keeps_ignoring_it(tmp_path: Path) -> None:
    # A Ctrl-C meant for a script's foreground command reaches its `shardrec train ... &` too
    # (one process group, SIGINT ignored, POSIX): the job trains on; SIGTERM still stops it.
    done = subprocess.run(
        [sys.executable, "-c", _SUPERVISE_WITH_SIGINT_IGNORED, str(tmp_path / "stop")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout == "0 None False True\n", done.stderr[-3000:]


_RANK = """
import os, signal, sys, time
from shardrec.trainer.distributed.stop import StopRequest
stop = StopRequest().install()
os.kill(os.getpid(), signal.SIGTERM)
os.kill(os.getpid(), signal.SIGTERM)  # the same request, forwarded by torchrun's agent
time.sleep(0.1)
print(stop.requested, stop.signal_name, flush=True)
time.sleep(1.2)
os.kill(os.getpid(), signal.SIGINT)  # a second request: at once
time.sleep(5)
print("still alive", flush=True)
"""


def test_a_rank_stops_at_once_on_a_second_signal_but_not_on_a_repeat_of_the_first() -> None:
    done = subprocess.run([sys.executable, "-c", _RANK], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGINT, done.stderr[-3000:]
    assert done.stdout == "True SIGTERM\n"


@pytest.mark.slow
def test_a_run_stopped_at_once_before_its_first_checkpoint_is_listed_as_stopped(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    run, tmpdir = tmp_path / "run", tmp_path / "tmp"
    tmpdir.mkdir()
    job = _start(tiny_dataset, run, nproc=1, tmpdir=tmpdir)
    deadline = time.monotonic() + 120
    while not (run / "config.toml").is_file() and time.monotonic() < deadline:
        time.sleep(0.05)  # rank 0 has started the run: it is one `shardrec runs` lists
    # Ctrl-C twice, as an impatient user presses it: the job ends at once, before step 10's
    # checkpoint.
    os.killpg(job.pid, signal.SIGINT)
    time.sleep(0.2)
    os.killpg(job.pid, signal.SIGINT)
    _, stderr = job.communicate(timeout=120)
    assert job.returncode == 128 + signal.SIGINT, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == (
        "stopped at once by a second signal (SIGINT); no checkpoint was written"
    )
    assert not (run / "checkpoints").is_dir() or not any((run / "checkpoints").iterdir())
    # torchrun's agent was killed: its log folder went with the launcher's.
    assert torchelastic_folders(tmpdir) == []
    listed = CliRunner().invoke(app, ["runs", str(tmp_path), "--json"])
    assert listed.exit_code == 0, listed.output
    assert [(r["step"], r["status"]) for r in json.loads(listed.stdout)] == [(None, "stopped")]
    table = CliRunner().invoke(app, ["runs", str(tmp_path)])
    assert "stopped" in table.stdout and "failed" not in table.stdout, table.stdout


def _agent_started(job: subprocess.Popen) -> bool:
    """Whether the launcher has started torchrun's agent (a child running the launch module)."""
    try:
        children = Path(f"/proc/{job.pid}/task/{job.pid}/children").read_text().split()
    except OSError:
        return False
    for child in children:
        try:
            if (
                b"shardrec.trainer.distributed.launch"
                in Path(f"/proc/{child}/cmdline").read_bytes()
            ):
                return True
        except OSError:
            continue
    return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
def test_ctrl_c_while_torchrun_starts_stops_like_a_later_one(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    # The agent is still importing torch: before, it died there in a KeyboardInterrupt traceback
    # and the launcher said "training failed (torchrun exit code -2)".
    run = tmp_path / "run"
    job = _start(tiny_dataset, run, nproc=1, slow=False)
    deadline = time.monotonic() + 120
    while not _agent_started(job) and time.monotonic() < deadline:
        time.sleep(0.005)
    os.killpg(job.pid, signal.SIGINT)
    _, stderr = job.communicate(timeout=180)
    assert job.returncode == STOPPED, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    assert (
        stderr.strip()
        .splitlines()[-1]
        .endswith("checkpoint written; rerun the same command to resume")
    ), stderr[-3000:]


_SIGNALS_AROUND_THE_LAUNCH = """
import os, signal, sys
from typer.testing import CliRunner
from shardrec.tools.cli import train as train_cli
from shardrec.tools.cli.app import app
from shardrec.trainer.distributed import launch as launch_module

signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a script's `shardrec train ... &` starts
check = train_cli.check_resume_checkpoint


def early(out_dir):  # a `kill` in the seconds before the ranks start
    os.kill(os.getpid(), signal.SIGTERM)
    return check(out_dir)


real = launch_module.launch


def late(*args, **kwargs):  # a second `kill` (Slurm's repeat) landing just after the ranks left
    result = real(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    return result


if sys.argv[1] == "early":
    train_cli.check_resume_checkpoint = early
else:
    launch_module.launch = late
result = CliRunner().invoke(app, sys.argv[2:])
sys.stderr.write(result.stderr)
sys.exit(result.exit_code)
"""


@pytest.mark.slow
def test_a_signal_before_the_ranks_start_or_after_they_left_is_the_stop_it_says(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    # Before: the early SIGTERM started the ranks only for them to stop at their first check,
    # ~10 s later, with a checkpoint ("stopped at step 10"); earlier still, it killed the launcher
    # (exit 143, no line). The late one killed the launcher after its last line (exit 143). SIGINT
    # stays ignored, as `&` leaves it (POSIX).
    run = tmp_path / "run"
    args = ["train", "--data", str(tiny_dataset), "--out-dir", str(run), *JOB]

    def train(when: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", _SIGNALS_AROUND_THE_LAUNCH, when, *args],
            capture_output=True,
            text=True,
            timeout=300,
        )

    early = train("early")
    assert early.returncode == STOPPED, early.stderr[-3000:]
    assert early.stderr.strip().splitlines()[-1] == (
        "SIGTERM before the ranks started: none started, nothing trained; "
        "rerun the same command to go on"
    ), early.stderr[-3000:]
    assert not list(run.glob("checkpoints/step-*")) and not list(run.glob("torchelastic*"))
    late = train("late")  # the same command goes on, and the signal after it is no kill
    assert late.returncode == 0, late.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())  # written by a run that finished
    assert summary["resumed_from_step"] in (None, 0), summary
