"""A stop (Ctrl-C, or a kill: SIGTERM) at any moment of a `shardrec` command ends it in one line,
`interrupted: ...`, exit code 130 (143 for SIGTERM): never a traceback, never a silent exit.

Each test sends a real signal to a fresh `shardrec` process at one chosen moment: as a module is
imported, or as a function is first called.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

_STOP_AT = """
import os, runpy, signal, sys

SIGNAL, KIND, NAME = sys.argv[1:4]


def stop():
    os.kill(os.getpid(), signal.Signals[SIGNAL])


class AtImport:  # the signal as module NAME is first imported
    def find_spec(self, name, path=None, target=None):
        if KIND == "import" and name == NAME:
            sys.meta_path.remove(self)
            stop()


def at_call(frame, event, arg):  # the signal as a function named NAME is first called
    if event == "call" and frame.f_code.co_name == NAME:
        sys.setprofile(None)
        stop()


sys.meta_path.insert(0, AtImport())
if KIND == "call":
    sys.setprofile(at_call)
sys.argv = ["shardrec", *sys.argv[4:]]
runpy.run_module("shardrec.tools.cli", run_name="__main__", alter_sys=True)
"""
"""`python -m shardrec.tools.cli ARGS`, sent SIGNAL (SIGINT: Ctrl-C; SIGTERM: a kill) as
NAME is imported (KIND "import") or first called (KIND "call")."""

CODES = {"SIGINT": 130, "SIGTERM": 143}


def stopped(sig: str, kind: str, name: str, *args: str | Path) -> subprocess.CompletedProcess:
    """`shardrec ARGS` (`python -m`), sent `sig` as module `name` is imported (`kind` "import")
    or a function `name` is first called ("call"); the finished process."""
    return subprocess.run(
        [sys.executable, "-c", _STOP_AT, sig, kind, name, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "command, function",
    [
        (["spec", "infer", "{log}", "--label", "click"], "infer_spec"),
        (["plan", "show", "{log}"], "show_cmd"),
        (["config", "defaults"], "defaults"),
    ],
)
def test_ctrl_c_in_a_command_of_a_group_is_one_line(
    tmp_path: Path, command: list[str], function: str
) -> None:
    # Before: exit 130 and nothing at all, where a command of `data` or `bench` said its line:
    # the commands of the groups that one module makes (spec, plan, config) were not wrapped.
    log = tmp_path / "log.csv"
    log.write_text("click,city\n1,paris\n0,rome\n")
    args = [a.replace("{log}", str(log)) for a in command]
    done = stopped("SIGINT", "call", function, *args)
    assert (done.returncode, done.stdout) == (130, ""), done.stderr[-3000:]
    said = " ".join(command[:2])
    assert done.stderr == f"interrupted: {said} stopped before it finished\n"


@pytest.mark.parametrize(
    "function",
    [
        "configure_logging",  # the root's callback: -v sets up logging
        "resolve_command",  # as the group finds the command, then reads its options
    ],
)
def test_ctrl_c_before_the_command_runs_is_one_line(tiny_dataset: Path, function: str) -> None:
    # Before: exit 130 and nothing at all (typer's own handling).
    done = stopped("SIGINT", "call", function, "data", "stats", tiny_dataset)
    assert (done.returncode, done.stdout) == (130, ""), done.stderr[-3000:]
    assert done.stderr == "interrupted: data stats had not started: nothing written\n"
