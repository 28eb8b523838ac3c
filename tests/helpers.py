"""Assertions shared by tests (importable as `helpers`: tests/ is on sys.path via conftest.py).

`assert_one_line_error` is the check behind every "bad input gets one clear line" test. typer's
CliRunner catches any exception into `result.exception` and prints no traceback, so checking
`"Traceback" not in result.output` cannot fail; what can fail is asking that the exit came from a
deliberate `typer.Exit(1)` (a SystemExit) and that stderr holds exactly that one line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

from process_table import processes
from typer.testing import Result

# Log records the CLI and the ranks write to stderr while they work (configure_logging's format,
# the ranks' with "[rank N]"); a subprocess shows them, and they are not part of the error message.
_LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d (\[rank \d+\] )?(DEBUG|INFO) \S+: ")


def assert_one_line_error(result: Result | subprocess.CompletedProcess, pattern: str) -> str:
    """Assert a command failed the way bad input must: exit code 1, no traceback, and exactly one
    line on stderr, which matches the regular expression `pattern` (re.search). Returns that line.

    result: typer's CliRunner result, or a finished subprocess run with text=True.
    """
    if isinstance(result, subprocess.CompletedProcess):
        code, stderr = result.returncode, result.stderr
        assert "Traceback" not in stderr, stderr[-3000:]
    else:
        code, stderr = result.exit_code, result.stderr
        if not isinstance(result.exception, SystemExit):
            shown = (
                "".join(traceback.format_exception(result.exception))
                if result.exception
                else "no exception"
            )
            raise AssertionError(
                f"expected a deliberate typer.Exit(1), got:\n{shown}\nstderr: {stderr}"
            )
    assert code == 1, f"exit code {code}, expected 1; stderr:\n{stderr[-3000:]}"
    lines = [line for line in stderr.splitlines() if line.strip() and not _LOG_LINE.match(line)]
    assert len(lines) == 1, (
        f"expected one line on stderr, got {len(lines)}:\n" + "\n".join(lines)[-3000:]
    )
    assert re.search(pattern, lines[0]), f"stderr line {lines[0]!r} does not match {pattern!r}"
    return lines[0]


def cli(*args, ok: bool = True) -> Result:
    """`shardrec ARGS` in this process (typer's CliRunner); with ok, assert it exited 0."""
    from typer.testing import CliRunner

    from shardrec.tools.cli.app import app

    result = CliRunner().invoke(app, [str(a) for a in args])
    if ok:
        assert result.exit_code == 0, result.output
    return result


def cli_process(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, ok: bool = True
) -> subprocess.CompletedProcess:
    """`shardrec ARGS` as a process of its own in `cwd` (as the user starts a command that starts
    ranks), its output captured; with `ok`, exit code 0 is asserted, with the output's tail."""
    done = subprocess.run(
        [sys.executable, "-m", "shardrec.tools.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )
    if ok:
        assert done.returncode == 0, f"{args}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def rank_site(site: Path, code: str) -> dict[str, str]:
    """An environment whose Python runs `code` in every process it starts (a sitecustomize.py in
    `site`, first on PYTHONPATH); `code` tells torchrun's ranks by LOCAL_RANK."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(code)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def no_rank_env(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment for a command that must refuse before any rank starts, and the file a rank
    started in it creates (torchrun's ranks have LOCAL_RANK)."""
    marker = tmp_path / "a-rank-started"
    code = f"import os\nif 'LOCAL_RANK' in os.environ:\n    open({str(marker)!r}, 'w').close()\n"
    return rank_site(tmp_path / "no-rank-site", code), marker


def record_syncs_and_renames(monkeypatch) -> list[str]:
    """Record every os.fsync and os.replace from now on, in order, as "fsync NAME" (the synced
    file's or directory's name, read from /proc/self/fd) and "replace NAME" (the target's name),
    so a test can tell a file's own fsync from its directory's."""
    import os

    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append(f"fsync {Path(os.readlink(f'/proc/self/fd/{fd}')).name}")
        real_fsync(fd)

    def replace(src, dst) -> None:
        events.append(f"replace {Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


EVENT_SPEC = """
[items.artist]
file = "artist_item_mapping.parquet"
value = "artist_id"

[history]
length = 12
min_history = 4
"""
"""The event spec the event-log tests share (a Yambda-like log: `write_yambda_like`): the artist
item map and a 12-event history."""


TINY_MODEL = ("model.embedding_dim=8", "model.dense_arch=[16, 8]", "model.over_arch=[16, 1]")
"""A model small enough for end-to-end training runs of seconds (8-wide tables, 16-unit layers)."""


def jobs_handed_to_ranks(monkeypatch) -> list:
    """The jobs `shardrec train` hands its ranks (JobConfig each), with no rank started: the
    launcher is replaced by one that keeps the job and reports failed ranks (the CLI then says
    training failed, exit 1)."""
    from shardrec.trainer.distributed import launch
    from shardrec.trainer.job.config import load_job_config

    handed = []

    def fake_launch(args: list[str], *_, **__) -> launch.LaunchResult:
        parsed = dict(zip(args[::2], args[1::2]))
        handed.append(load_job_config(Path(parsed["--job"])))
        return launch.LaunchResult(1)

    monkeypatch.setattr(launch, "launch", fake_launch)
    return handed


def settings(*items: str) -> list[str]:
    """`--set ITEM` for each item, as a command line takes them."""
    return [flag for item in items for flag in ("--set", item)]


TINY_CPU_JOB = settings(
    'train.device="cpu"',  # CPU ranks (gloo) even on a GPU host: 2 ranks must not need 2 GPUs
    *TINY_MODEL,
    "train.global_batch_size=64",
    'data.eval_splits=["val"]',
    "train.log_interval=1000",
)
"""The tiny job the launcher's tests train (tests/robustness/test_train_launcher.py,
test_train_damaged_checkpoints.py)."""


def train_command(data: Path | str, run_dir: Path | str, *args: str, nproc: int = 2) -> list[str]:
    """`shardrec train` on `nproc` local ranks, as a user runs it (a subprocess), with --json."""
    import sys

    return [
        sys.executable,
        "-m",
        "shardrec.tools.cli",
        "train",
        "--data",
        str(data),
        "--out-dir",
        str(run_dir),
        "--nproc-per-node",
        str(nproc),
        "--json",
        *args,
    ]


def click_city_spec(header: bool = True, hash_size: int = 1000) -> str:
    """A CSV feature spec of two columns: the label `click` and the string categorical `city`."""
    return f"""[format]
kind = "csv"
header = {str(header).lower()}

{CLICK_CITY.format(size=hash_size)}"""


CLICK_CITY = """[[columns]]
name = "click"
role = "label"

[[columns]]
name = "city"
role = "categorical"
kind = "string"
hash_size = {size}
"""
"""The label `click` and the string categorical `city` (hash_size `size`) of a feature spec."""


def train_tiny(data: Path | str, run_dir: Path | str, *items: str) -> subprocess.CompletedProcess:
    """`shardrec train` of the tiny model on one CPU rank, evaluating "val", with `items` as its
    --set items; the finished process (it must have succeeded)."""
    job = settings(*TINY_MODEL, 'data.eval_splits=["val"]', 'train.device="cpu"', *items)
    done = subprocess.run(
        train_command(data, run_dir, *job, nproc=1), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return done


def torchelastic_folders(tmpdir: Path) -> list[str]:
    """The log folders torchrun's agent left in the temporary directory `tmpdir` (its TMPDIR):
    torch's own (`torchelastic_*`: one a run it is given no --log-dir for, never removed) and the
    one the launcher gives it instead (trainer.distributed.launch)."""
    names = (p.name for p in tmpdir.iterdir())
    return sorted(n for n in names if n.startswith(("torchelastic_", "torchrun-logs-")))


def run_direct_rank(*args: str, **env: str | None) -> subprocess.CompletedProcess:
    """`python -m shardrec.trainer ARGS` as torchrun starts it on each node (the README's
    multi-node path), as the one rank of a one-rank group, with no `shardrec train` before it;
    `env` replaces those variables (RANK="1", ...; None: unset)."""
    import os
    import sys

    rank_env = {
        **os.environ,
        **{"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"},
        # Port 0: the rank's own store takes one of the kernel's choosing as it binds. A free port
        # found here could be another process's by the time the rank, past importing torch, binds.
        **{"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0"},
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "shardrec.trainer", *args],
        env={name: value for name, value in rank_env.items() if value is not None},
        capture_output=True,
        text=True,
        timeout=300,
    )


def fake_nvidia_smi(directory: Path, driver: str | None = "580.65.06", gpus: int = 1) -> Path:
    """Write an executable `nvidia-smi` into `directory` (put it first on PATH) that lists `gpus`
    GPUs of driver `driver`, or that fails as it does without a loaded driver (`driver=None`)."""
    directory.mkdir(parents=True, exist_ok=True)
    smi = directory / "nvidia-smi"
    if driver is None:
        body = 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."\nexit 9\n'
    else:
        listing = "".join(f'echo "GPU {i}: NVIDIA H200 (UUID: GPU-{i:08d})"\n' for i in range(gpus))
        drivers = f'echo "{driver}"\n' * gpus
        body = (
            f'case "$*" in\n  *driver_version*)\n{drivers};;\n  *-L*)\n{listing};;\n'
            f'  *) echo "Driver Version: {driver}";;\nesac\n'
        )
    smi.write_text("#!/bin/sh\n" + body)
    smi.chmod(0o755)
    return smi


def trainer_ranks(run_dir: Path) -> list[int]:
    """Pids of live trainer ranks (`python -m shardrec.trainer ...`) working on `run_dir`."""

    def is_rank(argv: list[bytes]) -> bool:
        return any(
            argv[i : i + 2] == [b"-m", b"shardrec.trainer"] for i in range(1, 4)
        )  # torchrun adds -u

    return [
        p.pid
        for p in processes()
        if is_rank(p.argv) and str(run_dir).encode() in p.argv and p.state != "Z"
    ]


def final_weights(run_dir: Path, part: str = "model") -> dict:
    """A part of the run's last checkpoint as full tensors (read offline, no process group)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ckpt = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    dcp_to_torch_save(ckpt, run_dir / "final.pt")
    state = torch.load(run_dir / "final.pt", weights_only=False)[part]
    if part == "fused_optim":
        return {
            name: value for entries in state["state"].values() for name, value in entries.items()
        }
    return state


def tensorboard_scalars(run_dir: Path, run: str = "") -> dict[str, list[tuple[int, float]]]:
    """RUN/tensorboard as TensorBoard shows it: each scalar tag's (step, value) points, of its
    run folder `run` (RUN/tensorboard/RUN; "": the events in RUN/tensorboard itself)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard" / run))
    events.Reload()
    return {
        tag: [(e.step, round(e.value, 6)) for e in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


def final_step_counters(run_dir: Path) -> dict[str, int]:
    """The fbgemm step counters (per table) of the run's last checkpoint; {} where it has none."""
    import torch

    final_weights(run_dir)  # writes final.pt, the whole checkpoint
    state = torch.load(run_dir / "final.pt", weights_only=False)["fused_optim"]
    return {t: int(c.item()) for t, c in state.get("step_counters", {}).items()}


def start_cli_job(args: list[str], tmpdir: Path, stdout: int = subprocess.PIPE) -> subprocess.Popen:
    """`shardrec ARGS` as a shell starts a job: in a process group (session) of its own, its
    temporary folders under `tmpdir` (TMPDIR), stderr read as text."""
    return subprocess.Popen(
        [sys.executable, "-m", "shardrec.tools.cli", *args],
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmpdir)},
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_ranks(job: subprocess.Popen, ranks, count: int = 2, timeout_s: float = 120) -> list:
    """`ranks()` (the job's rank processes) once it lists `count`, the job still running."""
    deadline = time.monotonic() + timeout_s
    found: list = []
    while len(found) < count:
        assert job.poll() is None and time.monotonic() < deadline, "its ranks never ran"
        time.sleep(0.05)
        found = ranks()
    return found
