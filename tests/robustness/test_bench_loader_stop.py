"""A stopped `shardrec bench loader` removes the data it was writing into its temporary folder and
ends in one line, as bench preprocess does (test_bench_stop.py): Ctrl-C with exit code 130, a
kill (SIGTERM) with 143."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "kill"]
)
def test_a_stopped_bench_loader_removes_its_data_in_one_line(
    sig: signal.Signals, code: int, tmp_path: Path
) -> None:
    job = subprocess.Popen(
        # Rows enough that writing them outlasts the wait for the folder and the stop.
        [sys.executable, "-m", "shardrec.tools.cli", "bench", "loader", "--rows", "1000000",
         "--rounds", "1", "--max-batches", "4"],
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # where its temporary folder goes
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not _its_folders(tmp_path):  # it writes its data
            assert job.poll() is None and time.monotonic() < deadline, "no temporary folder"
            time.sleep(0.02)
        os.killpg(job.pid, sig)  # a terminal's Ctrl-C, or a `kill` of its group
        _, stderr = job.communicate(timeout=60)
    finally:
        job.kill()
        job.wait(timeout=60)
    assert job.returncode == code, stderr[-3000:]
    assert stderr.splitlines() == ["interrupted: nothing measured"], stderr
    assert _its_folders(tmp_path) == [], "its temporary folder is left"


def _its_folders(tmp: Path) -> list[Path]:
    """The benchmark's temporary folders in `tmp` (torch keeps its compile cache there too)."""
    return list(tmp.glob("shardrec-*"))


CTRL_C_IN_GENERATED_CODE = """
import runpy, sys
from shardrec.tools.bench.loader import loader_bench

def write_bench_data(*args, **kwargs):
    # A Ctrl-C landing in code exec() runs: the making of a dataclass's methods, as the
    # benchmark's first imports after making its folder make them (at ~10 ms).
    exec("raise KeyboardInterrupt")

loader_bench.write_bench_data = write_bench_data
sys.argv = ["shardrec", "bench", "loader", "--rounds", "1"]
runpy.run_module("shardrec.tools.cli", run_name="__main__", alter_sys=True)
"""


CTRL_C_IN_SET_NAME = CTRL_C_IN_GENERATED_CODE.replace(
    """    exec("raise KeyboardInterrupt")""",
    """    class CtrlC:  # in __set_name__, as each dataclass field's: rich.table's Column is made
        def __set_name__(self, owner, name):  # then (at ~15 ms)
            raise KeyboardInterrupt

    class Column:
        cells = CtrlC()""",
)


@pytest.mark.parametrize(
    "script", [CTRL_C_IN_GENERATED_CODE, CTRL_C_IN_SET_NAME], ids=["exec", "set-name"]
)
def test_a_ctrl_c_in_generated_code_still_exits_130_under_python_m(
    tmp_path: Path, script: str
) -> None:
    """CI once saw the line and exit status -2: CPython took the KeyboardInterrupt, raised inside
    exec()'d code and caught by the command, for an unhandled one and ended `python -m` by SIGINT
    at exit. One raised in __set_name__ Python 3.11 wraps in RuntimeError: before, its traceback
    ('Error calling __set_name__ on 'CtrlC' instance'), exit 1."""
    (tmp_path / "ctrl_c_in_generated_code.py").write_text(script)
    job = subprocess.run(
        [sys.executable, "-m", "ctrl_c_in_generated_code"],
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )
    assert job.returncode == 130, job.stderr[-3000:]
    assert job.stderr.splitlines() == ["interrupted: nothing measured"], job.stderr
    assert _its_folders(tmp_path) == [], "its temporary folder is left"
