"""Run a command and measure it as a whole: wall time, CPU time and peak RSS of its process tree.

`ru_maxrss` of RUSAGE_CHILDREN is the largest single process, not what a run with worker
processes holds at once; so a thread samples /proc every `interval` seconds and sums the resident
set of the child and all its descendants. Shared pages (libraries, the page cache of a mapped
file) count once per process that maps them, as `ps` and `top` count them: the sum is an upper
bound of what the tree needs. A process that lives shorter than one interval may be missed.
"""

from __future__ import annotations

import os
import resource
import subprocess
import threading
import time
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            out.extend(int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split())
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return out


def tree_rss_bytes(pid: int) -> int:
    """Resident bytes of pid and every descendant, right now (0 once it has exited)."""
    total, todo, seen = 0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * _PAGE
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        todo.extend(_children(p))
    return total


def run_measured(cmd: list[str], env: dict[str, str] | None = None, interval: float = 0.02) -> dict:
    """Run cmd to the end; returns wall_s, cpu_s (user + system of the whole tree), peak_rss_mb (MiB),
    returncode, stdout and stderr. CPU time counts descendants that were waited for (pool workers)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss_bytes(proc.pid))
            done.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_mb": peak[0] / 2**20,  # MiB, as ru_maxrss / 1024 elsewhere
        "returncode": proc.returncode,
        "stdout": stdout,
        "stderr": stderr,
    }
