"""Start the per-rank trainer under torchrun (torch.distributed.run, the elastic launcher)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_command(
    entry_args: list[str],
    nproc_per_node: int,
    max_restarts: int = 0,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "shardrec",
    module: str = "shardrec.trainer",
) -> list[str]:
    """The torchrun command line that starts `python -m MODULE ENTRY_ARGS` on every rank.

    One node without an endpoint rendezvous on a free local port; several nodes need the
    same `rdzv_endpoint` (HOST:PORT of node 0) on each.
    """
    if nproc_per_node < 1:
        raise ValueError(f"--nproc-per-node must be at least 1, got {nproc_per_node}")
    if nnodes > 1 and not rdzv_endpoint:
        raise ValueError("several nodes need a rendezvous endpoint HOST:PORT")
    endpoint = rdzv_endpoint or f"127.0.0.1:{free_port()}"
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}", f"--max-restarts={max_restarts}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}",
        "-m", module, *entry_args,
    ]


def rank_environment(nproc_per_node: int) -> dict[str, str]:
    """The environment for the ranks: the cores shared out among them unless OMP_NUM_THREADS is set."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc_per_node)))
    return env


def launch(entry_args: list[str], nproc_per_node: int, max_restarts: int = 0) -> int:
    """Run torchrun on this machine and wait; returns its exit code (0 when every rank succeeded)."""
    return subprocess.call(torchrun_command(entry_args, nproc_per_node, max_restarts), env=rank_environment(nproc_per_node))
