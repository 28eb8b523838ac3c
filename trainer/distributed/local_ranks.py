"""A function on N new local processes, each a rank of one process group (`run_local_ranks`):
tests, the planner's calibration and the benchmarks that measure inside ranks. The trainer's
own ranks start under torchrun (launch.py)."""

from __future__ import annotations

import socket
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from shardrec.trainer.distributed.dist import LOOPBACK


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


class RankFailed(RuntimeError):
    """A rank started by `run_local_ranks` raised; carries its traceback."""

    def __init__(self, rank: int, trace: str) -> None:
        super().__init__(f"rank {rank} failed:\n{trace}")
        self.rank = rank
        self.trace = trace

    @property
    def reason(self) -> str:
        """The exception's own line (the traceback's last), for one-line messages."""
        lines = self.trace.strip().splitlines()
        return lines[-1] if lines else "no traceback"


def _local_rank_entry(
    rank: int,
    *,
    world_size: int,
    port: int,
    device_kind: str,
    collective_timeout_s: int,
    threads: int | None,
    fn: Callable[..., Any],
    args: tuple,
    queue: Any,
) -> None:
    import torch
    import torch.distributed

    from shardrec.trainer.distributed.dist import init_local_rank, shutdown

    if threads is not None:  # as torchrun's ranks get them (OMP_NUM_THREADS, launch.py)
        torch.set_num_threads(threads)
    try:
        env = init_local_rank(
            rank,
            world_size,
            port,
            device_kind=device_kind,
            timeout_s=collective_timeout_s,
            hosted_store=True,
        )
        # Every rank has joined before any runs fn: a rank done early must not tear the group
        # down while another still connects (gloo: "connectFullMesh failed ... closed by peer",
        # reported instead of the other rank's own error).
        torch.distributed.barrier()
        queue.put((rank, "ok", fn(env, *args)))
    except BaseException:  # report any failure to the parent instead of hanging it
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        shutdown()


def run_local_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    device_kind: str = "cpu",
    timeout_s: float = 300,
    collective_timeout_s: int = 120,
) -> list[Any]:
    """Run fn(env, *args) on `world_size` new local processes, each a rank of one process group.

    `fn` must be a module-level function (the processes are spawned, not forked: torch's threads
    must not be copied) and its arguments and result picklable. Returns the results in rank
    order; raises RankFailed for the first rank that raised, and queue.Empty when a rank reports
    nothing for `timeout_s`. The ranks share out the cores (devices.rank_threads) unless
    OMP_NUM_THREADS is set.
    """
    import torch.multiprocessing as mp

    from shardrec.trainer.distributed.devices import rank_threads
    from shardrec.trainer.distributed.rendezvous import loopback_store

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    # The ranks' store is served from here, on a port held from the start: a port found free and
    # bound by rank 0 seconds later (once it imported torch) could be taken meanwhile (CI's other
    # test worker binds and connects on ports of the kernel's choosing): EADDRINUSE.
    store = loopback_store(timedelta(seconds=collective_timeout_s))
    shared = {
        "world_size": world_size,
        "port": store.port,
        "device_kind": device_kind,
        "collective_timeout_s": collective_timeout_s,
        "threads": rank_threads(world_size),
        "fn": fn,
        "args": args,
        "queue": queue,
    }
    procs = [
        ctx.Process(target=_local_rank_entry, args=(r,), kwargs=shared) for r in range(world_size)
    ]
    results: dict[int, Any] = {}
    try:
        # Inside the try: a stop between two starts ends the ranks already started, which would
        # wait for the others at the rendezvous (and this process, exiting, for them).
        for p in procs:
            p.start()
        for _ in range(world_size):
            rank, status, value = queue.get(timeout=timeout_s)
            if status == "error":
                raise RankFailed(rank, value)
            results[rank] = value
    except KeyboardInterrupt:  # Ctrl-C, or a SIGTERM raised as one (sigterm_as_ctrl_c)
        for p in _started(procs):  # which may not have reached them: they would run on
            p.kill()
        raise
    finally:
        for p in _started(procs):
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world_size)]


def _started(procs: list[Any]) -> list[Any]:
    """Those of `procs` started (a pid): an unstarted one can be neither killed nor joined."""
    return [p for p in procs if p.pid is not None]
