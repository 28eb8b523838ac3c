"""Worker processes for preprocessing tasks, and what happens when one of them dies.

concurrent.futures' ProcessPoolExecutor rather than multiprocessing.Pool: when a worker dies
(SIGKILL, the OOM killer) Pool starts a replacement and the lost task's result never comes, so
the run waits forever; the executor instead marks itself broken and fails every pending future,
so the run ends at once, naming the tasks that were running.

Workers never see Ctrl-C or a kill meant for the command (SIGINT or SIGTERM to its process group):
they start with both signals blocked (`_signals_held`), and the run stops them. Before, a Ctrl-C
in a run's first second reached the workers while they imported their modules: each printed a
traceback and died, the pool broke while the run cancelled its futures, and Python's executor
(3.11: `terminate_broken` sets an exception on a cancelled future, InvalidStateError) left the
run waiting forever on futures no worker would finish.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, nullcontext
from typing import Any

from shardrec.tools.preprocess.tasks.task import Task, TaskOptions


class WorkerDied(RuntimeError):
    """A worker process ended without finishing its task (killed by a signal, e.g. out of
    memory)."""


class Pool:
    """Worker processes kept over several map_tasks passes (vocabulary mode counts, then preprocesses):
    each worker's start-up (spawn, imports, loading the compiled kernels) is paid once."""

    def __init__(self, workers: int, tasks: int) -> None:
        ctx = mp.get_context("spawn")  # no fork: the CLI's progress thread must not be copied
        self.started = ctx.Array(
            "b", tasks, lock=False
        )  # set by a worker as it takes a task (by position)
        self.executor = ProcessPoolExecutor(
            workers, mp_context=ctx, initializer=_init_worker, initargs=(self.started,)
        )


@contextmanager
def shared_pool(workers: int, tasks: int) -> Iterator[Pool | None]:
    """A Pool for passes of at most `tasks` tasks each; None where map_tasks runs in-process
    anyway."""
    if workers == 1 or tasks <= 1:
        yield None
        return
    pool = Pool(min(workers, tasks), tasks)
    try:
        yield pool
    finally:
        pool.executor.shutdown(wait=True, cancel_futures=True)


def map_tasks(
    fn: Callable[[Task, TaskOptions], Any],
    tasks: list[Task],
    opts: TaskOptions,
    workers: int,
    pool: Pool | None = None,
) -> Iterator[tuple[Task, Any]]:
    """Run fn over tasks in worker processes (pool's, or a pool of this pass's); yields (task,
    result) in task order.

    Raises WorkerDied (after the other workers are stopped) if a worker process dies.
    """
    if workers == 1 or len(tasks) <= 1:
        for t in tasks:
            yield t, fn(t, opts)
        return
    with shared_pool(workers, len(tasks)) if pool is None else nullcontext(pool) as run_in:
        started = run_in.started
        started[:] = [0] * len(started)  # a kept pool's flags still hold the last pass's
        with _signals_held():  # the submits start the workers
            futures = [
                run_in.executor.submit(_run_marked, fn, i, t, opts) for i, t in enumerate(tasks)
            ]
        try:
            for t, fut in zip(tasks, futures):
                try:
                    res = fut.result()
                except BrokenProcessPool:
                    lost = [
                        tasks[j] for j, f in enumerate(futures) if started[j] and not _succeeded(f)
                    ]
                    raise _worker_died(lost or [t]) from None
                yield t, res
        finally:
            # Tasks not started are dropped, running ones finish (their markers stay valid).
            for fut in futures:
                fut.cancel()
            wait(futures)


def map_stream(
    fn: Callable[[Task, TaskOptions], Any],
    produce: Callable[[int], Task | None],
    opts: TaskOptions,
    workers: int,
    slots: int,
    warm: Callable[[], Any] | None = None,
) -> Iterator[tuple[Task, Any]]:
    """Run fn over tasks made as the run goes: produce(slot) makes the next task (None: no more),
    its input in slot `slot` of `slots` (1 on one worker), which is free again once the task's
    result is yielded. Yields (task, result) as tasks finish. Raises WorkerDied as map_tasks does.
    warm: run once per worker as the pool starts, so that their start-up overlaps the first produce.
    """
    if workers == 1:
        while (task := produce(0)) is not None:
            yield task, fn(task, opts)
        return
    ctx = mp.get_context("spawn")
    # Per slot: 1 + the index of the task a worker took from it (tasks queued next are not running).
    started = ctx.Array("q", slots, lock=False)
    pool = ProcessPoolExecutor(
        workers, mp_context=ctx, initializer=_init_worker, initargs=(started,)
    )
    if warm is not None:  # each submit finds no idle worker and spawns one
        with _signals_held():
            for _ in range(workers):
                pool.submit(warm)
    running: dict[Future, tuple[Task, int]] = {}
    free, ended = list(range(slots - 1, -1, -1)), False
    try:
        while True:
            while free and not ended:  # the producer runs here while the workers parse
                slot = free.pop()
                task = produce(slot)
                if task is None:
                    ended = True
                    break
                try:
                    with _signals_held():  # a submit may start a worker
                        running[pool.submit(_run_in_slot, fn, slot, task, opts)] = (task, slot)
                except BrokenProcessPool:  # a worker died since the last wait
                    raise _worker_died(_lost(running, started) or [task]) from None
            if not running:
                return
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: running[f][0].index):
                try:
                    res = fut.result()
                except BrokenProcessPool:
                    raise _worker_died(_lost(running, started) or [running[fut][0]]) from None
                task, slot = running.pop(fut)
                free.append(slot)
                yield task, res
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


_HELD = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def _signals_held() -> Iterator[None]:
    """Within it (on the main thread), SIGINT and SIGTERM wait instead of arriving; a worker process
    started here inherits the blocked mask through its exec and never receives them. One that
    arrives meanwhile is delivered to the command when the block ends, as KeyboardInterrupt (or
    the command's SIGTERM handler), a moment late, not lost."""
    if (
        not hasattr(signal, "pthread_sigmask")
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _lost(running: dict[Future, tuple[Task, int]], started: Any) -> list[Task]:
    """The tasks a worker was running (its slot's flag names them) that did not finish."""
    return [t for f, (t, s) in running.items() if started[s] == t.index + 1 and not _succeeded(f)]


def _worker_died(lost: list[Task]) -> WorkerDied:
    return WorkerDied(
        f"a worker process died (killed by a signal, e.g. out of memory) while running "
        f"{'; '.join(_describe(x) for x in lost)}; finished tasks are kept: rerun to finish"
    )


_STARTED: list[Any] = []  # in a worker: the shared flags of _map's run


def _init_worker(started: Any) -> None:
    _STARTED[:] = [started]


def _run_marked(
    fn: Callable[[Task, TaskOptions], Any], i: int, task: Task, opts: TaskOptions
) -> Any:
    _STARTED[0][i] = 1
    return fn(task, opts)


def _run_in_slot(
    fn: Callable[[Task, TaskOptions], Any], slot: int, task: Task, opts: TaskOptions
) -> Any:
    _STARTED[0][slot] = task.index + 1
    return fn(task, opts)


def _succeeded(fut: Future) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is None


def _describe(task: Task) -> str:
    where = "" if task.end < 0 else f" bytes {task.start}-{task.end}"
    return f"task {task.index} ({task.path}{where})"
