"""Ctrl-C during `shardrec bench preprocess` (README, Failures and trust: Benchmarks): whichever
step it lands in (generating the file, the child preprocess, the polars pipeline), the benchmark
ends with one line and exit code 130, no child's error, and its temporary folder removed. A kill
(SIGTERM) of the benchmark alone ends it and its children the same way, exit code 143."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from process_table import kill_session, session_processes

pytest.importorskip("polars")


def _start(tmp: Path, ignored: bool = False) -> subprocess.Popen:
    """The benchmark in a process group of its own (a shell's job), its temporary folder in `tmp`.
    ignored: started with SIGINT ignored, as `cmd &` in a script starts it."""
    return subprocess.Popen(
        [sys.executable, "-m", "shardrec.tools.cli", "bench", "preprocess", "--size-gb", "0.03",
         "--rounds", "1"],
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmp)},  # where its temporary folder goes
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored else None,
    )  # fmt: skip


def _ctrl_c_at(step: str, tmp_path: Path) -> tuple[int, list[str]]:
    """SIGINT to the benchmark's group once it says it starts `step`; its exit code and stderr
    lines."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    job = _start(tmp)
    lines = []
    for line in job.stderr:
        lines.append(line.rstrip("\n"))
        if line.startswith(step):
            os.killpg(job.pid, signal.SIGINT)
            break
    else:
        raise AssertionError(f"never reached {step!r}: " + "\n".join(lines[-40:]))
    lines += job.stderr.read().splitlines()
    job.wait(timeout=60)
    assert list(tmp.iterdir()) == [], "its temporary folder is left"
    return job.returncode, [line for line in lines if line.strip()]


@pytest.mark.parametrize(
    "step",
    ["generating", "timing shardrec preprocess", "timing the polars pipeline (1 thread(s))"],
    ids=["generating", "child-preprocess", "polars"],
)
def test_ctrl_c_ends_the_benchmark_in_one_line(step: str, tmp_path: Path) -> None:
    code, lines = _ctrl_c_at(step, tmp_path)
    assert code == 130, "\n".join(lines[-40:])
    assert lines[-1] == "interrupted: nothing measured", "\n".join(lines[-40:])
    assert all(line.startswith(("generating ", "timing ")) for line in lines[:-1]), lines


def test_a_benchmark_started_with_sigint_ignored_keeps_ignoring_it(tmp_path: Path) -> None:
    # A script's `shardrec bench preprocess &` starts so: a Ctrl-C meant for the script's
    # foreground command reaches the job too (one process group), and must not stop it (POSIX).
    job = _start(tmp_path, ignored=True)
    try:
        lines = []
        for line in job.stderr:
            lines.append(line.rstrip("\n"))
            if line.startswith("generating"):
                os.killpg(job.pid, signal.SIGINT)
            if line.startswith("timing shardrec preprocess"):
                break
        assert lines[-1].startswith("timing shardrec preprocess"), "\n".join(lines[-40:])
        assert job.poll() is None  # it goes on measuring
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=60)


@pytest.mark.parametrize(
    "step",
    ["generating", "timing shardrec preprocess", "timing the polars pipeline (1 thread(s))"],
    ids=["generating", "child-preprocess", "polars"],
)
def test_a_kill_of_the_benchmark_alone_ends_its_children_in_one_line(
    step: str, tmp_path: Path
) -> None:
    # A script's `shardrec bench preprocess &` ignores Ctrl-C and is stopped by `kill PID`: the
    # signal reaches the benchmark alone, not its child runs.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    job = _start(tmp, ignored=True)
    try:
        lines = []
        for line in job.stderr:
            lines.append(line.rstrip("\n"))
            if line.startswith(step):
                break
        else:
            raise AssertionError(f"never reached {step!r}: " + "\n".join(lines[-40:]))
        deadline = time.monotonic() + 30
        while step != "generating" and len(session_processes(job.pid)) < 2:  # its child runs
            assert time.monotonic() < deadline, "no child started: " + "\n".join(lines[-40:])
            time.sleep(0.05)
        os.kill(job.pid, signal.SIGTERM)
        lines += job.stderr.read().splitlines()
        job.wait(timeout=60)
        time.sleep(0.2)  # what the benchmark signalled last has had time to go
        left = [p.command for p in session_processes(job.pid)]
        assert left == [], "its children survive the kill"
    finally:
        kill_session(job.pid)
        job.wait(timeout=60)
    lines = [line for line in lines if line.strip()]
    assert job.returncode == 143, "\n".join(lines[-40:])
    assert lines[-1] == "interrupted: nothing measured", "\n".join(lines[-40:])
    assert all(line.startswith(("generating ", "timing ")) for line in lines[:-1]), lines
    assert list(tmp.iterdir()) == [], "its temporary folder is left"


def test_a_kill_as_the_memory_sampler_starts_stops_the_run_as_a_kill(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The moment the kill tests above send it: the child has appeared and the benchmark is starting
    # the thread that samples its memory. Before, the stop left that thread unstarted in the list
    # joined on the way out: 'error: cannot join thread before it is started', exit 1, not 143.
    from shardrec.tools.bench import proctree
    from shardrec.tools.cli.common import Terminated, sigterm_as_ctrl_c

    start, kills = threading.Thread.start, []

    def start_after_a_kill(thread: threading.Thread) -> None:
        if not kills:  # one kill, at the first thread started (the sampler)
            kills.append(os.kill(os.getpid(), signal.SIGTERM))
            time.sleep(0.3)  # a handler let run has raised by now
        start(thread)

    # This test process's children of its own (a pytest-xdist worker's earlier tests may have
    # left some that live as long as it: multiprocessing's resource tracker).
    others = set(proctree._children(os.getpid()))
    monkeypatch.setattr(threading.Thread, "start", start_after_a_kill)
    with sigterm_as_ctrl_c(), pytest.raises(Terminated):
        proctree.run_measured([sys.executable, "-c", "import time; time.sleep(60)"])
    left = set(proctree._children(os.getpid())) - others
    assert left == set(), "the child outlived the stopped run"
