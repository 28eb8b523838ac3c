"""How a `shardrec` command is stopped: Ctrl-C (SIGINT) raises KeyboardInterrupt, and a kill
(SIGTERM) raises Terminated, one of its kind, so that every `except KeyboardInterrupt` stops the
command the same way for both, in one line (common.interrupted), exit code 130 or 143. And the
commands (COMMANDS), by which that line names the command as typed before the app is loaded.

The entry point (entry.py) takes SIGTERM with it before the typer app's imports: beyond what
Python's start-up has imported, only signal and threading are imported here (not even typing, 7
ms), for a stop in those first milliseconds is still Python's own traceback.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt (sigterm_as_ctrl_c), so that the
    command's `except KeyboardInterrupt` stops it the same way."""


@contextlib.contextmanager
def ctrl_c_unwrapped() -> Iterator[None]:
    """A Ctrl-C (or Terminated) that Python 3.11 wrapped as it made a class raises as itself: one
    landing in a field's __set_name__ (a dataclass module imported) is a RuntimeError('Error
    calling __set_name__ ...') caused by it, and ended the command in that traceback, exit 1."""
    try:
        yield
    except RuntimeError as e:
        if isinstance(e.__cause__, KeyboardInterrupt):
            raise e.__cause__ from None
        raise


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within it, SIGTERM (a plain `kill`: how a job a script started with `&`, which ignores
    Ctrl-C, is stopped) raises Terminated, which the command's `except KeyboardInterrupt` turns
    into interrupted()'s line: by default the command died at once, leaving the file it was
    writing under its temporary name. One started with SIGTERM ignored keeps it so. A Ctrl-C
    that Python wrapped as it made a class reaches that `except` as itself (ctrl_c_unwrapped).

    The `shardrec` command holds it from its first line to its last (entry.main); a command's
    own is for its function called in-process, and a nested one leaves the handler as it was."""
    take = (
        signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        and threading.current_thread() is threading.main_thread()
    )
    if take:
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        with ctrl_c_unwrapped():
            yield
    finally:
        if take:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def stop_exit_code() -> int:
    """The exit code of a command stopped by the exception being handled: 143 for a kill
    (Terminated), 130 for Ctrl-C, as a shell gives for a process these signals end."""
    return 143 if isinstance(sys.exc_info()[1], Terminated) else 130


def forget_a_handled_ctrl_c() -> None:
    """Keep the exit code a command chose after a Ctrl-C it handled (130, interrupted()).

    CPython marks a KeyboardInterrupt that ends code run by exec() of a string as unhandled, even
    where a caller catches it, and under `python -m` it then ends the process by SIGINT after
    everything else (exit status -2 to a parent, nothing printed): a Ctrl-C landing in the code
    a dataclass or namedtuple generates, as a lazy import runs it, did so to `python -m
    shardrec.tools.cli bench loader` on CI. An exec() that ends normally clears the mark (3.11 to
    3.13); no KeyboardInterrupt leaves the entry point's main() (it says its line, and typer
    turns one into exit code 130), so none here is unhandled."""
    exec("")  # noqa: S102 - only to clear the mark, see above


# The commands in the order a user meets them (`shardrec --help` lists them so), each with the
# module under shardrec.tools.cli whose `register(app)` adds it. A module is imported only when
# its command runs (or `--help` lists it): `shardrec runs` must not pay for torch or numba.
COMMANDS = {
    "synth": "synth",
    "spec": "spec",
    "preprocess": "preprocess",
    "data": "data.data_app",
    "plan": "plan",
    "train": "train",
    "eval": "eval",
    "export": "export",
    "predict": "predict",
    "runs": "runs",
    "report": "report",
    "config": "config_cmd",
    "bench": "bench.bench_app",
}


def command_as_typed(groups: list[str], args: list[str], commands: dict[str, str]) -> str:
    """The command named in `args` as the user typed it (`bench preprocess`), with the `groups`
    above; `commands`: the group's (each with its module: a dotted one lists commands of its
    own)."""
    words = [a for a in args if not a.startswith("-")]  # no group option takes a value
    if not words or words[0] not in commands:
        return " ".join(groups) or "shardrec"
    group = "." in commands[words[0]]
    return " ".join([*groups, *words[: 2 if group else 1]])
