"""A stop (Ctrl-C, or a kill: SIGTERM) at any moment of a `shardrec` command ends it in one line,
`interrupted: ...`, exit code 130 (143 for SIGTERM): never a traceback, never a silent exit.

Each test sends a real signal to a fresh `shardrec` process at one chosen moment: as a module is
imported, or as a function is first called. (Python's own start-up, before any of shardrec's
code runs, is the one moment left where a stop is Python's.)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from helpers import cli

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["shardrec"]
"""What the installed `shardrec` runs (module:function), as pip writes its console script."""

_STOP_AT = """
import importlib, os, runpy, signal, sys

SIGNAL, KIND, NAME, START = sys.argv[1:5]


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
sys.argv = ["shardrec", *sys.argv[5:]]
if START == "python -m":
    runpy.run_module("shardrec.tools.cli", run_name="__main__", alter_sys=True)
else:  # the console script: `from MODULE import FUNCTION; sys.exit(FUNCTION())`
    module, function = START.split(":")
    sys.exit(getattr(importlib.import_module(module), function)())
"""
"""`shardrec ARGS` started as START (`python -m`, or the console script's module:function), sent
SIGNAL (SIGINT: Ctrl-C; SIGTERM: a kill) as NAME is imported (KIND "import") or first called
(KIND "call")."""

CODES = {"SIGINT": 130, "SIGTERM": 143}


def stopped(
    sig: str, kind: str, name: str, *args: str | Path, start: str = "python -m"
) -> subprocess.CompletedProcess:
    """`shardrec ARGS` (`start`: `python -m` or the console script's SCRIPT), sent `sig` as
    module `name` is imported (`kind` "import") or a function `name` is first called ("call");
    the finished process."""
    return subprocess.run(
        [sys.executable, "-c", _STOP_AT, sig, kind, name, start, *map(str, args)],
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
    "kind, name",
    [
        # Before: exit 130 and nothing at all (typer's own handling).
        ("call", "configure_logging"),  # the root's callback: -v sets up logging
        ("call", "resolve_command"),  # as the group finds the command, then reads its options
        # Before: 'interrupted: data had not started: nothing written'.
        ("import", "shardrec.tools.cli.data.data_app"),
    ],
)
def test_ctrl_c_before_the_command_runs_is_one_line(
    tiny_dataset: Path, kind: str, name: str
) -> None:
    done = stopped("SIGINT", kind, name, "data", "stats", tiny_dataset)
    assert (done.returncode, done.stdout) == (130, ""), done.stderr[-3000:]
    assert done.stderr == "interrupted: data stats had not started: nothing written\n"


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("start", ["python -m", SCRIPT])
@pytest.mark.parametrize("module", ["typer", "shardrec.tools.cli.common"])
def test_a_stop_as_the_command_line_itself_loads_is_one_line(
    tmp_path: Path, sig: str, start: str, module: str
) -> None:
    # Before, in the first ~0.2 s (typer, rich and click imported): Ctrl-C printed Python's
    # traceback, exit status -2; a kill ended the command at once, -15, without a word.
    out = tmp_path / "syn"
    done = stopped(sig, "import", module, "synth", out, start=start)
    assert (done.returncode, done.stdout) == (CODES[sig], ""), done.stderr[-3000:]
    assert done.stderr == "interrupted: synth had not started: nothing written\n"
    assert not out.exists()


def _takes_sigterm(pid: int) -> bool | None:
    """Whether process `pid` has a handler of its own for SIGTERM (/proc's SigCgt); None once it
    has ended."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads SigCgt in /proc")
@pytest.mark.parametrize("attempt", range(3))
def test_a_kill_the_moment_the_command_takes_one_is_one_line(tmp_path: Path, attempt: int) -> None:
    # The kill is sent as soon as /proc shows the command's SIGTERM handler, at a real moment of
    # its start (~0.1-0.2 s in, typer still loading). Before, the handler came only with synth's
    # own (~1 s in, its line then 'the files written so far are kept'); a kill before ended the
    # command at once (-15, no word).
    out = tmp_path / "syn"
    job = subprocess.Popen(
        [sys.executable, "-m", "shardrec.tools.cli", "synth", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while (takes := _takes_sigterm(job.pid)) is False:
        pass
    if takes:
        os.kill(job.pid, signal.SIGTERM)
    _, stderr = job.communicate(timeout=120)
    assert (job.returncode, stderr) == (
        143,
        "interrupted: synth had not started: nothing written\n",
    )
    assert not out.exists()


def test_a_kill_of_a_command_that_only_reads_is_one_line(tiny_dataset: Path) -> None:
    # Before: exit status -15 and no word, where Ctrl-C said its line.
    done = stopped("SIGTERM", "call", "_table", "data", "stats", tiny_dataset)
    assert (done.returncode, done.stdout) == (143, ""), done.stderr[-3000:]
    assert done.stderr == "interrupted: data stats stopped before it finished\n"


def _export(tmp_path: Path, data: Path) -> tuple[list[str], Path]:
    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests" / "fixtures" / "run-killed-at-step-6", run)
    out = tmp_path / "out" / "model.safetensors"
    return ["export", str(run), "--data", str(data), "--out", str(out)], out


def _import_npy(tmp_path: Path, data: Path) -> tuple[list[str], Path]:
    cli("data", "export-npy", data, "--out", tmp_path / "npy")
    out = tmp_path / "out" / "imported"
    return ["data", "import-npy", str(tmp_path / "npy"), "--out", str(out)], out


def _multihot(tmp_path: Path, data: Path) -> tuple[list[str], Path]:
    out = tmp_path / "out" / "multi"
    sizes = ["--sizes", "2,2,2,2", "--cache", str(tmp_path / "cache")]
    return ["data", "multihot", str(data), "--out", str(out), *sizes], out


@pytest.mark.parametrize(
    "command, function, says",
    [
        (_export, "_write_tensor", "{out}: nothing written; rerun the same command to export"),
        (
            _import_npy,
            "compute_feature_stats",
            "{out}: nothing written (the dataset is written in a temporary folder beside it, now "
            "removed); rerun the same command",
        ),
        (
            _multihot,
            "_feature_stats",
            "{out}: nothing written (parts are converted in a temporary folder, now removed); "
            "the index tables drawn are kept; rerun the same command",
        ),
    ],
    ids=["export", "import-npy", "multihot"],
)
def test_a_kill_as_a_command_writes_leaves_no_temporary_file(
    tmp_path: Path, tiny_dataset: Path, command, function: str, says: str
) -> None:
    # Before: exit status -15, no word, and the file or folder being written left beside OUT
    # under its temporary name (.model.safetensors.tmp-PID, .imported.import-npy-PID.tmp,
    # .multi.tmp-PID), which no rerun removes (but multihot's own).
    args, out = command(tmp_path, tiny_dataset)
    done = stopped("SIGTERM", "call", function, *args)
    assert done.returncode == 143, done.stderr[-3000:]
    assert done.stderr == f"interrupted: {says.format(out=out)}\n"
    assert list(out.parent.iterdir()) == []


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_of_an_npy_import_or_export_says_what_is_kept(
    tmp_path: Path, tiny_dataset: Path, sig: str
) -> None:
    # Before: 'interrupted: data import-npy stopped before it finished' (likewise export-npy),
    # which says neither what is left nor how to go on, as the other commands that write do.
    args, out = _import_npy(tmp_path, tiny_dataset)
    done = stopped(sig, "call", "compute_feature_stats", *args)
    assert (done.returncode, done.stdout) == (CODES[sig], ""), done.stderr[-3000:]
    assert done.stderr == (
        f"interrupted: {out}: nothing written (the dataset is written in a temporary folder "
        "beside it, now removed); rerun the same command\n"
    )
    assert list(out.parent.iterdir()) == []
    days = tmp_path / "days"
    done = stopped(
        sig, "call", "_mark_export_complete", "data", "export-npy", tiny_dataset, "--out", days
    )
    assert (done.returncode, done.stdout) == (CODES[sig], ""), done.stderr[-3000:]
    assert done.stderr == (
        f"interrupted: {days}: the day files written so far are kept (none half-written), "
        "without export-complete.json, which is written last; rerun the same command\n"
    )
    assert sorted(p.name for p in days.iterdir()) == sorted(
        p.name for p in (tmp_path / "npy").iterdir() if p.name != "export-complete.json"
    )
