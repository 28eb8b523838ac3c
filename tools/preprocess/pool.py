"""Worker processes for preprocessing tasks, and what happens when one of them dies.

concurrent.futures' ProcessPoolExecutor rather than multiprocessing.Pool: when a worker dies
(SIGKILL, the OOM killer) Pool starts a replacement and the lost task's result never comes, so
the run waits forever; the executor instead marks itself broken and fails every pending future,
so the run ends at once, naming the tasks that were running.

Workers never see Ctrl-C (SIGINT to the command's process group): they start with it blocked
(`workers_starting`), and the run stops them. Before, a Ctrl-C in a run's first second reached the
workers while they imported their modules: each printed a traceback and died, the pool broke while
the run cancelled its futures, and Python's executor (3.11: `terminate_broken` sets an exception on
a cancelled future, InvalidStateError) left the run waiting forever on futures no worker would
finish. SIGTERM stays theirs: the executor stops a broken pool's workers with it.
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
        futures: list[Future] = []
        with _ending(run_in.executor, lambda: futures):
            with workers_starting():  # the submits start the workers
                for i, t in enumerate(tasks):
                    futures.append(run_in.executor.submit(_run_marked, fn, i, t, opts))
            for t, fut in zip(tasks, futures):
                try:
                    res = fut.result()
                except BrokenProcessPool:
                    lost = [
                        tasks[j] for j, f in enumerate(futures) if started[j] and not _succeeded(f)
                    ]
                    raise _worker_died(lost or [t]) from None
                yield t, res


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
    running: dict[Future, tuple[Task, int]] = {}
    free, ended = list(range(slots - 1, -1, -1)), False
    try:
        with _ending(pool, lambda: list(running)):
            if warm is not None:  # each submit finds no idle worker and spawns one
                with workers_starting():
                    for _ in range(workers):
                        pool.submit(warm)
            while True:
                while free and not ended:  # the producer runs here while the workers parse
                    slot = free.pop()
                    task = produce(slot)
                    if task is None:
                        ended = True
                        break
                    try:
                        with workers_starting():  # a submit may start a worker
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
        pool.shutdown(wait=True)


@contextmanager
def _ending(executor: ProcessPoolExecutor, futures: Callable[[], list[Future]]) -> Iterator[None]:
    """How a pass over `executor` ends, with `futures()` its tasks' futures then:
    - a task failed: tasks not started are dropped, running ones finish (their markers stay valid);
    - a worker died (WorkerDied): the executor fails every future itself; cancelling them too would
      race it;
    - Ctrl-C, a kill, or the pass's consumer closing it: the workers go at once (`_stop_now`).
    Either way it returns once every future is done."""
    try:
        yield
    except WorkerDied:
        raise
    except Exception:
        for fut in futures():
            fut.cancel()
        raise
    except BaseException:
        _stop_now(executor)
        raise
    finally:
        _wait_all(executor, futures())


def _wait_all(executor: ProcessPoolExecutor, futures: list[Future]) -> None:
    """Wait for `futures` to be done; if the executor's manager thread is gone meanwhile (Python
    3.11 stops it with InvalidStateError where a future was cancelled as a broken pool failed it:
    a task's error and a group's kill at once), nothing will finish them: the workers go now."""
    while wait(futures, timeout=0.5).not_done:
        thread = getattr(executor, "_executor_manager_thread", None)
        if thread is None or not thread.is_alive():
            _stop_now(executor)
            return


def _stop_now(executor: ProcessPoolExecutor) -> None:
    """End a run's workers at once (a stopped run keeps its finished tasks; a killed task's output
    is only a temporary file, which the rerun removes), and then the executor, without cancelling
    its futures: the executor fails them all, broken. Cancelling them here raced the executor's
    own failing of a pool broken by the same stop (a group's SIGTERM kills the workers too): on
    Python 3.11 a future both cancelled and failed stops its manager thread (InvalidStateError),
    and the run then waited forever on a worker left alive (2 of 6 tries)."""
    processes = getattr(executor, "_processes", None) or {}  # the executor's own, by pid
    for process in list(processes.values()):
        process.kill()
    executor.shutdown(wait=True, cancel_futures=False)


@contextmanager
def workers_starting() -> Iterator[None]:
    """Around a submit that may start worker processes (the first one also starts the executor's
    manager thread), on the main thread:
    - SIGINT is blocked: a worker started here inherits the mask (through spawn's exec, or fork)
      and never receives Ctrl-C. Not SIGTERM: the executor stops the workers of a broken pool
      with it, and a worker that held it ran on, its run gone.
    - A stop (SIGINT, SIGTERM) arriving meanwhile is held and delivered as the submit returns, a
      moment late, not lost. Delivered between the executor making its manager thread and
      starting it, it left a thread that the pool's shutdown could not join, and the command
      ended 'error: cannot join thread before it is started' (exit 1) in place of its stop's line
      (CI: bench scale killed in its synth stage). Held by handler, not by the mask: the kernel
      gives a signal to any thread not blocking it (a progress thread), and Python then runs the
      handler on the main thread all the same."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        held.append(signum)

    stops = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not None]
    # Taken first: a stop between two swaps leaves the earlier swapped, to be put back too.
    handlers = {s: signal.getsignal(s) for s in stops}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        for s in stops:
            signal.signal(s, hold)
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for s, handler in handlers.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(held):
            signal.raise_signal(s)  # to the command's own handler, as it would have come


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
