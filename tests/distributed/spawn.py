"""Run a module-level worker function on N gloo ranks and collect what each returns."""

from __future__ import annotations

import os
import traceback
from typing import Any, Callable

import torch.multiprocessing as mp

from shardrec.trainer.launch import free_port


def _entry(rank: int, world_size: int, port: int, fn: Callable[..., Any], args: tuple, queue: Any) -> None:
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    from shardrec.trainer.dist import init_distributed, shutdown

    try:
        env = init_distributed("cpu", timeout_s=120)
        queue.put((rank, "ok", fn(env, *args)))
    except BaseException:  # report any failure to the parent instead of hanging it
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        shutdown()


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 300) -> list[Any]:
    """Spawn `world_size` processes running fn(env, *args); returns results in rank order."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world_size, port, fn, args, queue)) for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(world_size):
            rank, status, value = queue.get(timeout=timeout_s)
            if status == "error":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world_size)]
