"""Run a command and measure it as a whole: wall time, CPU time and peak memory of its process tree.

`ru_maxrss` of RUSAGE_CHILDREN is the largest single process, not what a run with worker
processes holds at once; so a thread samples /proc every `interval` seconds and sums, over the
child and all its descendants, two measures taken at the same instant:
- RSS (statm): shared pages (libraries, the page cache of a mapped file) count once per process
  that maps them, as `ps` and `top` count them: an upper bound of what the tree needs;
- PSS (smaps_rollup): a page shared by n processes counts 1/n in each, so the sum is what the
  tree holds once (the figure the scale goals are stated in). Reading smaps_rollup walks the
  page tables, so it costs more than statm; where the kernel has no smaps_rollup it reads 0.
A process that lives shorter than one interval may be missed.

smaps_rollup of a process that has imported torch is costly to read (500+ mappings); read for
every process of a tree at every sample, the sampler took a whole core of the 2 it shares with
what it measures. So PSS is read at most PSS_CPU_SHARE of one core while RSS is still sampled
every `interval`: a PSS peak shorter than that gap may be missed, which the stages of a
benchmark, lasting seconds to minutes, are not.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE")
PSS_CPU_SHARE = 0.05
"""The most of one core the sampler spends reading smaps_rollup."""
END_GRACE_S = 5.0
"""How long a child stopped by Ctrl-C is given to end on it before it is killed."""


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            out.extend(int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split())
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return out


def _pss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024  # kB
    except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError, ValueError):
        pass
    return 0


def tree_memory_bytes(pid: int, pss: bool = True) -> tuple[int, int]:
    """(RSS, PSS) in bytes of pid and every descendant, summed, right now ((0, 0) once it has
    exited); PSS is 0 unless `pss` (it costs far more to read)."""
    rss = total_pss = 0
    for p in _tree(pid):
        try:
            rss += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * _PAGE
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        if pss:
            total_pss += _pss_bytes(p)
    return rss, total_pss


def _tree(pid: int) -> list[int]:
    """pid and every descendant of it, right now (pid first)."""
    todo, seen = [pid], []
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.append(p)
            todo.extend(_children(p))
    return seen


def _running(pid: int) -> bool:
    """Whether pid is a process that has not exited (an exited child not yet waited for has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _signal(pids: list[int], signum: int) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signum)


def _end(started: list[int], proc: subprocess.Popen | None, ctrl_c: bool) -> None:
    """End the children of a stopped run (`started`: `proc`'s pid, or, where the stop came while
    Popen started it, the children that appeared since), with every process of their trees.

    ctrl_c: the terminal's Ctrl-C stopped it, which reached the children too (one process group):
    they are given END_GRACE_S to stop on it. Any other stop (a SIGTERM of this process alone, an
    error here) reached none: their trees are sent SIGTERM first. What is left then is killed;
    the trees are listed before, since a child's workers are not its once it is gone."""
    tree = [p for pid in started for p in _tree(pid)]
    if not ctrl_c:
        _signal(tree, signal.SIGTERM)
    deadline = time.monotonic() + END_GRACE_S
    while any(_running(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.02)
    _signal(tree, signal.SIGKILL)  # an exited child's pid stays its own until it is waited for
    for pid in started:
        if proc is not None and pid == proc.pid:
            proc.wait()
        else:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def interrupted_by_ctrl_c(returncode: int, stderr: str) -> bool:
    """Whether a child ended on SIGINT: killed by it, exit code 130, or a KeyboardInterrupt it
    printed (polars' threads report one so)."""
    return returncode in (130, -signal.SIGINT) or "KeyboardInterrupt" in stderr


def run_to_end(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run cmd to the end, its stdout and stderr captured as text. A stop on the way (Ctrl-C; a
    SIGTERM, which sigterm_as_ctrl_c raises as a KeyboardInterrupt; an error here) ends its whole
    tree first, as run_measured does: subprocess.run would kill the child alone, and a launcher's
    ranks in sessions of their own would run on."""
    proc, stdout, stderr = _wait_ended_on_stop(cmd, env, lambda proc: None)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _wait_ended_on_stop(
    cmd: list[str], env: dict[str, str] | None, started: Callable[[subprocess.Popen], None]
) -> tuple[subprocess.Popen, str, str]:
    """Start cmd (started(proc) once it runs) and wait for it; on a stop, end its tree (_end)."""
    others = set(_children(os.getpid()))
    proc: subprocess.Popen | None = None
    try:
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        started(proc)
        stdout, stderr = proc.communicate()
    except BaseException as e:
        # The child is gone before the caller removes the folders it writes into. Only a plain
        # KeyboardInterrupt is the terminal's Ctrl-C (a SIGTERM raises a subclass of it).
        pids = [proc.pid] if proc else sorted(set(_children(os.getpid())) - others)
        _end(pids, proc, ctrl_c=type(e) is KeyboardInterrupt)
        raise
    return proc, stdout, stderr


def run_measured(cmd: list[str], env: dict[str, str] | None = None, interval: float = 0.02) -> dict:
    """Run cmd to the end (as run_to_end); returns wall_s, cpu_s (user + system of the whole tree),
    peak_rss_mb and peak_pss_mb (MiB, the tree's sums), returncode, stdout and stderr. CPU time
    counts descendants that were waited for (pool workers)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    peak, done = [0, 0], threading.Event()

    def sample(pid: int) -> None:
        next_pss = 0.0
        while not done.is_set():
            now, cpu = time.perf_counter(), time.thread_time()
            read_pss = now >= next_pss
            rss, pss = tree_memory_bytes(pid, pss=read_pss)
            if read_pss:
                next_pss = now + (time.thread_time() - cpu) / PSS_CPU_SHARE
            peak[0], peak[1] = max(peak[0], rss), max(peak[1], pss)
            done.wait(interval)

    samplers: list[threading.Thread] = []

    def start_sampler(proc: subprocess.Popen) -> None:
        # Listed (to be joined) once started: a stop (Ctrl-C, a kill) arriving as it starts, the
        # moment the child appears, left an unstarted thread whose join failed ('cannot join
        # thread before it is started', exit 1) in place of the stop's line. One the stop cut
        # off inside start() is a daemon that ends on `done`, unjoined.
        sampler = threading.Thread(target=sample, args=(proc.pid,), daemon=True)
        sampler.start()
        samplers.append(sampler)

    try:
        proc, stdout, stderr = _wait_ended_on_stop(cmd, env, start_sampler)
    finally:
        done.set()
        for sampler in samplers:
            sampler.join()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "peak_rss_mb": peak[0] / 2**20,  # MiB, as ru_maxrss / 1024 elsewhere
        "peak_pss_mb": peak[1] / 2**20,
        "returncode": proc.returncode,
        "stdout": stdout,
        "stderr": stderr,
    }
