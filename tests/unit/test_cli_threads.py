"""The `shardrec` command's processes run numpy's BLAS on one thread (no command uses it; with more,
numpy's import starts threads that spin idle, ~0.1 CPU-s per process), unless the user set it."""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = """
import os
from shardrec.tools.cli import app
app.app = lambda: None  # the entry point's set-up is tested, not a command
app.main()
import numpy  # a command's first import of it
print(os.environ.get("OPENBLAS_NUM_THREADS"), len(os.listdir("/proc/self/task")))
"""


def _run(env_value: str | None) -> list[str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
    }
    if env_value is not None:
        env["OPENBLAS_NUM_THREADS"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_a_command_process_holds_no_idle_blas_threads() -> None:
    assert _run(None) == ["1", "1"]  # one thread: the process's own


def test_the_users_own_blas_setting_stands() -> None:
    assert _run("2") == ["2", "2"]
