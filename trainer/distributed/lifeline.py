"""Processes of a job die with the process that started them.

`shardrec train` starts torchrun's agent, which starts the ranks in sessions of their own: a
`kill -9` of the launcher's process group, or a closed terminal, reaches neither the ranks nor
(for a wrapper script) always the agent. Each of them therefore asks, as its first act, to be
killed when its parent goes: PR_SET_PDEATHSIG on Linux, a watchdog thread polling the parent's
pid elsewhere. The parent's pid travels in SHARDREC_PARENT_PID, so a child whose parent died
before it could ask notices (it has been re-parented) and goes at once.

A launcher that ends the job itself (`kill_tree`) does not wait on that: a rank still importing
has not asked yet, and would run on until it does, reading files the launcher is about to remove.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

logger = logging.getLogger(__name__)

PARENT_PID_ENV = "SHARDREC_PARENT_PID"
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
WATCHDOG_INTERVAL_S = 0.5
KILL_WAIT_S = 10.0
"""How long `kill_tree` waits for the killed processes to be gone."""


def _set_parent_death_signal(sig: int) -> bool:
    """Ask Linux to send `sig` to this process when its parent thread exits; False where it
    cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(WATCHDOG_INTERVAL_S)


def die_with_parent() -> None:
    """Make this process die (SIGKILL) as soon as its parent does.

    The parent is the pid in SHARDREC_PARENT_PID when the parent set it (see `child_environment`),
    else the parent of the moment. Then this process records itself as the parent of its own
    children (they inherit the environment), so a chain of processes dies link by link.
    """
    parent = int(os.environ.get(PARENT_PID_ENV) or os.getppid())
    if not _set_parent_death_signal(signal.SIGKILL):
        # Also covers the platforms without prctl; the thread costs one getppid every 0.5 s.
        threading.Thread(
            target=_watch_parent, args=(parent,), name="shardrec-parent-watchdog", daemon=True
        ).start()
    if os.getppid() != parent:  # the parent died before the signal was asked for
        os.kill(os.getpid(), signal.SIGKILL)
    os.environ[PARENT_PID_ENV] = str(os.getpid())


def child_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) naming this process as the parent its children must
    outlive."""
    out = dict(os.environ if env is None else env)
    out[PARENT_PID_ENV] = str(os.getpid())
    return out


def _children(pid: int) -> list[int]:
    """pid's child processes, right now ([] where /proc does not say: not Linux, or it is gone)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                out.extend(
                    int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
                )
    return out


def _start_time(pid: int) -> str | None:
    """pid's start time (/proc/PID/stat), None once it has exited (a zombie has)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def kill_tree(proc: subprocess.Popen, wait_s: float = KILL_WAIT_S) -> None:
    """SIGKILL `proc` and every process under it, and return once they are gone (at most `wait_s`
    seconds for those not this process's children): a caller may then remove what they read.

    `proc` is stopped first, so that it starts no process after its tree was listed. Where /proc
    lists no children (not Linux) `proc` alone is killed, and its descendants go as they asked
    (`die_with_parent`)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGSTOP)
    tree, todo = [], _children(proc.pid)
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.append(pid)
            todo.extend(_children(pid))
    started = {pid: _start_time(pid) for pid in tree}
    for pid in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + wait_s
    # a pid whose start time changed is another process's now: that one is gone
    while time.monotonic() < deadline and any(
        t is not None and _start_time(pid) == t for pid, t in started.items()
    ):
        time.sleep(0.01)
