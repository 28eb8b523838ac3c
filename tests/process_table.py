"""The machine's processes as /proc shows them, for tests of what a command leaves running
(importable as `process_table`: tests/ is on sys.path via conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Proc:
    """One live process as /proc shows it."""

    pid: int
    ppid: int
    state: str
    argv: list[bytes]
    session: int

    @property
    def command(self) -> str:
        return b" ".join(self.argv).decode(errors="replace").strip()


def processes() -> list[Proc]:
    """Every process of this machine (those that end while being read are left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended while we looked
            continue
        found.append(Proc(int(entry.name), int(fields[1]), fields[0], argv, int(fields[3])))
    return found


def session_processes(sid: int) -> list[Proc]:
    """The running processes (zombies left out) of session `sid`: a command started with
    start_new_session=True and every process under it, whichever parent they have now."""
    return [p for p in processes() if p.session == sid and p.state != "Z"]


def kill_session(sid: int) -> None:
    """SIGKILL to every process of session `sid`: a test's clean-up, whatever it left."""
    for p in session_processes(sid):
        with contextlib.suppress(OSError):
            os.kill(p.pid, signal.SIGKILL)
