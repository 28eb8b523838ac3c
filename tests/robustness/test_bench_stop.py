"""Ctrl-C during `shardrec bench preprocess` (README, Failures and trust: Benchmarks): whichever
step it lands in (generating the file, the child preprocess, the polars pipeline), the benchmark
ends with one line and exit code 130, no child's error, and its temporary folder removed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("polars")


def _ctrl_c_at(step: str, tmp_path: Path, ignored: bool = False) -> tuple[int, list[str]]:
    """The benchmark in a process group of its own (a shell's job), SIGINT to the group once it
    says it starts `step`; its exit code and stderr lines. ignored: started with SIGINT ignored,
    as `cmd &` in a script starts it."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    job = subprocess.Popen(
        [sys.executable, "-m", "shardrec.tools.cli", "bench", "preprocess", "--size-gb", "0.03",
         "--rounds", "1"],
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmp)},  # where its temporary folder goes
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored else None,
    )  # fmt: skip
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
    "step, ignored",
    [
        ("generating", True),
        ("timing shardrec preprocess", False),
        ("timing the polars pipeline (1 thread(s))", False),
    ],
    ids=["generating-started-with-sigint-ignored", "child-preprocess", "polars"],
)
def test_ctrl_c_ends_the_benchmark_in_one_line(step: str, ignored: bool, tmp_path: Path) -> None:
    code, lines = _ctrl_c_at(step, tmp_path, ignored)
    assert code == 130, "\n".join(lines[-40:])
    assert lines[-1] == "interrupted: nothing measured", "\n".join(lines[-40:])
    assert all(line.startswith(("generating ", "timing ")) for line in lines[:-1]), lines
