"""The preprocessing worker pool when a worker dies: one error naming the task it ran, whenever the
death is noticed (as a task's result, or as the next task is handed out)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from concurrent.futures.process import _ExecutorManagerThread
from pathlib import Path

import pytest

from shardrec.tools.bench.scale.scale_bench import synth_days
from shardrec.tools.cli.common import Terminated, sigterm_as_ctrl_c
from shardrec.tools.preprocess.pool import WorkerDied, map_stream, map_tasks
from shardrec.tools.preprocess.tasks.task import Task


def _die(task: Task, marker: str) -> None:
    Path(marker).touch()
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_dying_while_the_next_task_is_made_is_named(tmp_path: Path):
    marker = tmp_path / "dying"
    made: list[int] = []

    def produce(slot: int) -> Task | None:
        made.append(slot)
        if len(made) == 2:  # the producer decodes the next range while the first worker dies
            deadline = time.time() + 60
            while not marker.exists() and time.time() < deadline:
                time.sleep(0.01)
            time.sleep(1.0)  # the pool has seen its worker go
        if len(made) > 2:
            return None
        return Task(len(made), "day.gz", 0, 10 * len(made), -1, (), "train", False)

    with pytest.raises(WorkerDied) as died:
        list(map_stream(_die, produce, str(marker), 2, 2))
    assert str(died.value) == (
        "a worker process died (killed by a signal, e.g. out of memory) while running task 1 "
        "(day.gz bytes 0-10); finished tasks are kept: rerun to finish"
    )


def _rest(task: Task, opts: None) -> int:
    time.sleep(0.05)
    return task.index


def _stop_as_the_manager_thread_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kill (SIGTERM, Ctrl-C's under sigterm_as_ctrl_c) arriving after the executor made its
    manager thread and before it started it: the stop's moment in the CI run where bench scale's
    synth stage ended 'error: cannot join thread before it is started' (exit 1, not 143)."""
    start = _ExecutorManagerThread.start

    def start_after_a_kill(thread: _ExecutorManagerThread) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.3)  # a handler let run would have raised by now
        start(thread)

    monkeypatch.setattr(_ExecutorManagerThread, "start", start_after_a_kill)


@pytest.mark.parametrize("pool", ["preprocess", "bench scale synth"])
def test_a_kill_as_the_pool_starts_stops_the_run_as_a_kill(
    pool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    others = set(multiprocessing.active_children())  # an earlier test's, in this worker
    _stop_as_the_manager_thread_starts(monkeypatch)
    with sigterm_as_ctrl_c(), pytest.raises(Terminated):
        if pool == "preprocess":
            tasks = [Task(i, "day.gz", 0, 10, -1, (), "train", False) for i in range(3)]
            list(map_tasks(_rest, tasks, None, 2))
        else:
            synth_days(tmp_path, 1e-6, 2)
    deadline = time.monotonic() + 10
    while set(multiprocessing.active_children()) - others and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(multiprocessing.active_children()) - others == set(), "a worker outlived the run"


def test_a_kill_as_the_stops_are_held_back_leaves_ctrl_c_as_it_was(monkeypatch: pytest.MonkeyPatch):
    """A kill between holding back Ctrl-C and holding back the kill itself: the command stops
    on it, and Ctrl-C reaches the command again (it stayed held back, for good, before)."""
    from shardrec.tools.preprocess.pool import workers_starting

    swap, ctrl_c = signal.signal, signal.getsignal(signal.SIGINT)

    def swap_then_kill(signum: int, handler):
        old = swap(signum, handler)
        if signum == signal.SIGINT and getattr(handler, "__name__", "") == "hold":
            os.kill(os.getpid(), signal.SIGTERM)
        return old

    monkeypatch.setattr(signal, "signal", swap_then_kill)
    with sigterm_as_ctrl_c(), pytest.raises(Terminated), workers_starting():
        pass
    assert signal.getsignal(signal.SIGINT) is ctrl_c
