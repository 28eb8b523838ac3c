"""The preprocessing worker pool when a worker dies: one error naming the task it ran, whenever the
death is noticed (as a task's result, or as the next task is handed out)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from shardrec.tools.preprocess.pool import WorkerDied, map_stream
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
