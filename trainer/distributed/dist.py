"""The one place that reads RANK / WORLD_SIZE (and sets them, for the local ranks that
`trainer.distributed.local_ranks.run_local_ranks` starts without torchrun) and owns the process group.

Everything else receives a `DistEnv`. torch is imported where a group is joined: `shardrec train`
reads the launcher's variables (launched_world_size) before any torch import.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from shardrec.trainer.distributed.devices import check_ranks_fit, resolve_device_kind

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
"""Where the processes of a job on one host meet: its rendezvous store (rendezvous.py, launch.py's
single-node command) and the local ranks' MASTER_ADDR."""


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_rank() -> int:
    """The rank torchrun gave this process, readable before the group is joined (for log set-up)."""
    return int(os.environ.get("RANK", 0))


def launched_local_rank() -> int:
    """This process's rank on its node as torchrun gave it (LOCAL_RANK; RANK where none did)."""
    return int(os.environ.get("LOCAL_RANK", launched_rank()))


def launched_world_size() -> int:
    """The WORLD_SIZE a launcher (torchrun, a cluster's job) gave this process: 1 where none did
    (or what it holds is no number)."""
    try:
        return int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        return 1


def init_local_rank(
    rank: int,
    world_size: int,
    port: int,
    *,
    device_kind: str = "cpu",
    timeout_s: int = 120,
    hosted_store: bool = False,
) -> DistEnv:
    """Join a group of `world_size` processes on this host as `rank`, rendezvous at
    127.0.0.1:`port`: a store rank 0 opens there, or (`hosted_store`) one the process that
    started the ranks serves, which every rank joins as torchrun's ranks join its agent's.

    For the processes `trainer.distributed.local_ranks.run_local_ranks` starts (not torchrun's): the
    variables torchrun would set are set here, since torchrec reads LOCAL_WORLD_SIZE itself.
    """
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR=LOOPBACK,
        MASTER_PORT=str(port),
        # Read by torch's env:// rendezvous: "True", a client on every rank. Set either way: a
        # rank may go on to a group of its own, which it then hosts (tests' 2-then-1 ranks).
        TORCHELASTIC_USE_AGENT_STORE=str(hosted_store),
    )
    return init_distributed(device_kind, timeout_s)


def init_distributed(
    device_kind: str = "auto", timeout_s: int = 600, bind_cores: bool = False
) -> DistEnv:
    """Join the process group that torchrun (or a test) described in the environment.

    Args:
        device_kind: "cpu", "cuda" or "auto" (cuda when available).
        timeout_s: collective timeout; a rank that hangs longer fails instead of waiting forever.
        bind_cores: on CPU, bind this rank to its share of the cores first (bind_to_cores).
    """
    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = launched_local_rank()
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    device_kind = resolve_device_kind(device_kind)
    if device_kind == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device kind 'cuda' was asked for but CUDA is not available")
        # Every rank checks the node's count (not its own index), so rank 0 says it too.
        check_ranks_fit(device_kind, local_world_size)
        device, backend = torch.device("cuda", local_rank), "nccl"
        torch.cuda.set_device(device)
    else:
        device, backend = torch.device("cpu"), "gloo"
        if bind_cores:
            bind_to_cores(local_rank, local_world_size)
    if not dist.is_initialized():
        _check_meeting_point(world_size)
        os.environ.setdefault("MASTER_ADDR", LOOPBACK)
        os.environ.setdefault("MASTER_PORT", "29500")
        timeout = timedelta(seconds=timeout_s)
        store = _restart_store(world_size, timeout)
        try:
            dist.init_process_group(
                backend=backend, rank=rank, world_size=world_size, timeout=timeout, store=store
            )
        except dist.DistNetworkError as e:
            # Rank 0 serves the store itself where no agent does (ranks started with RANK,
            # WORLD_SIZE and MASTER_* by hand): a port taken is the user's to change.
            if "EADDRINUSE" not in str(e):
                raise
            port = os.environ["MASTER_PORT"]
            raise ValueError(
                f"MASTER_PORT={port}: rank 0 cannot serve the process group's store on "
                f"{os.environ['MASTER_ADDR']}:{port}: another process listens there (another "
                "job's?); start the ranks with a free MASTER_PORT"
            ) from None
    env = DistEnv(rank, local_rank, world_size, local_world_size, device, backend)
    logger.debug("joined process group: %s", env)
    return env


START_WAIT_READ_S = 10.0
"""How long a rank that ends the job before it starts waits for the others to read why (its
node's agent may serve the store they read it from)."""


def agree_to_start(refusal: str | None, timeout_s: float) -> str | None:
    """Before any rank joins the process group, tell every rank whether this one refused its job
    (`refusal`, its one line; None: ready) and hear theirs, through the store torchrun's agents
    serve; return the line this rank ends with where another rank refused (naming its node and
    host), None where every rank is ready or where no agent serves a store (ranks started by hand,
    or one rank alone: then there is no one to tell).

    Without it, the ranks of a node that refused left the others waiting in init_process_group for
    the whole `dist.timeout_s` (or until torchrun's agent lost the refused node's store and killed
    them 30 s later), and those ended in torch's tracebacks. ValueError where the ranks cannot
    agree: one did not answer within `timeout_s` seconds, or the store went away (a node ended).
    """
    import json
    import socket

    import torch.distributed as dist

    world_size = launched_world_size()
    if world_size < 2 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    prefix = f"shardrec/start/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{attempt}"
    said = {"node": os.environ.get("GROUP_RANK", "?"), "host": socket.gethostname()}
    try:
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            world_size,
            is_master=False,
            timeout=timedelta(seconds=timeout_s),
        )
        store.set(f"{prefix}/{launched_rank()}", json.dumps({**said, "refusal": refusal}))
        keys = [f"{prefix}/{rank}" for rank in range(world_size)]
        store.wait(keys, timedelta(seconds=timeout_s))
        answers = [json.loads(store.get(key)) for key in keys]
        if store.add(f"{prefix}/read", 1) == world_size:
            # The last rank to read deletes the answers: torchrun restarts the workers of a node
            # that joins (elastic --nnodes) without counting a restart, so the next round's ranks
            # meet under this prefix again and must not read this round's answers as theirs.
            for key in [*keys, f"{prefix}/read"]:
                store.delete_key(key)
    except dist.DistStoreError:  # a timeout: the ranks that never answered are alive, or hung
        raise ValueError(
            f"not every rank said within {timeout_s:g} s (dist.timeout_s) whether it can start "
            f"the job (at the store on {address}): a node's ranks hang or died; see their output"
        ) from None
    except (dist.DistNetworkError, RuntimeError):
        raise ValueError(
            f"the job's store on {address} went away before every rank said whether it can "
            "start: the node whose torchrun served it ended; its output says why"
        ) from None
    refused = [(rank, a) for rank, a in enumerate(answers) if a["refusal"]]
    if refused:
        # A rank that refused, this one too, leaves only once every rank read the answers (then
        # they are deleted): its node's agent may serve the store.
        own, until = keys[launched_rank()], time.monotonic() + START_WAIT_READ_S
        with contextlib.suppress(dist.DistStoreError, dist.DistNetworkError, RuntimeError):
            while store.check([own]) and time.monotonic() < until:
                time.sleep(0.05)
    if refusal is not None or not refused:
        return None
    rank, first = refused[0]
    return (
        f"node {first['node']} (rank {rank}, host {first['host']}) refused the job, so no rank "
        f"starts; its output says why: {first['refusal']}"
    )


def _check_meeting_point(world_size: int) -> None:
    """Ranks of a group of several meet at rank 0's store, MASTER_ADDR:MASTER_PORT: a rank
    started without them must not wait dist.timeout_s at 127.0.0.1:29500 (one rank alone may)."""
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if world_size > 1 and missing:
        raise ValueError(
            f"WORLD_SIZE={world_size} but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not set: the ranks meet at rank 0's store, "
            "MASTER_ADDR:MASTER_PORT (rank 0's host and a free port there; torchrun sets both)"
        )


def bind_to_cores(local_rank: int, local_world_size: int) -> list[int] | None:
    """Bind this process to local rank `local_rank`'s equal share of the cores it may use (in
    core order: core_order; a job under `taskset` splits its set) and return them; None, binding nothing,
    for one local rank or cores that do not split evenly.

    Call it before the rank starts threads: they inherit it (torch's intra-op threads, gloo's,
    the loader's). Unbound, two CPU ranks' threads migrate between the cores and wait on each
    other at the collectives: on 2 cores, 4-11% fewer samples/s, stock torchrec's and ours alike,
    and timed rounds that spread 2-4x more (`shardrec bench train`, two pairs of runs)."""
    cpus = core_order(os.sched_getaffinity(0))
    if local_world_size < 2 or len(cpus) % local_world_size:
        return None
    share = len(cpus) // local_world_size
    mine = cpus[local_rank * share : (local_rank + 1) * share]
    os.sched_setaffinity(0, mine)
    logger.debug("rank %d bound to cores %s", local_rank, mine)
    return mine


def core_order(
    cpus: set[int] | list[int], sysfs: Path = Path("/sys/devices/system/cpu")
) -> list[int]:
    """`cpus` with each physical core's SMT threads side by side (by package and core id, as
    `sysfs` says), so that an even split gives each rank whole cores: most Intel hosts number a
    core's second thread N/2 after its first, and a split in number order would give two ranks
    each other's siblings. In number order where the topology is not there to read."""

    def place(cpu: int) -> tuple[int, int, int]:
        topology = sysfs / f"cpu{cpu}" / "topology"
        try:
            package = int((topology / "physical_package_id").read_text())
            return package, int((topology / "core_id").read_text()), cpu
        except (OSError, ValueError):
            return 0, cpu, cpu

    return sorted(cpus, key=place)


def bind_launched_rank() -> list[int] | None:
    """bind_to_cores for a rank torchrun started, before it joins a group (a program of someone
    else's, `bench train --reference`'s, placed as shardrec's ranks are)."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    return bind_to_cores(local_rank, int(os.environ.get("LOCAL_WORLD_SIZE", 1)))


def _restart_store(world_size: int, timeout: timedelta) -> dist.Store | None:
    """After a torchrun restart, a store whose keys cannot collide with the failed attempt's.

    torchrun shares one TCPStore across rendezvous rounds, so the process group of a restarted
    attempt would read the dead attempt's connection addresses (gloo: "connection refused").
    Prefixing the keys with the attempt number keeps the rounds apart.
    """
    import torch.distributed as dist

    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if attempt == "0" or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    client = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=timeout,
    )
    return dist.PrefixStore(f"shardrec/attempt_{attempt}", client)


class RankMissing(RuntimeError):
    """Ranks did not reach a barrier in time (lost, hung or dead); the message names them."""


def monitored_barrier(
    group: dist.ProcessGroup, timeout_s: float, what: str, setting: str = "dist.timeout_s"
) -> None:
    """A barrier over `group` (gloo) that fails after `timeout_s`, naming the ranks that did not
    arrive.

    Rank 0 waits for all the others and raises RankMissing naming every absent rank; the ranks
    that arrived raise RankMissing too, pointing at rank 0's message. `setting` is the config
    key of the timeout, for the message.
    """
    import time

    import torch.distributed as dist

    start = time.monotonic()
    try:
        dist.monitored_barrier(group, timeout=timedelta(seconds=timeout_s), wait_all_ranks=True)
    except RuntimeError as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        missing = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", reason)
        if missing:
            ranks = missing.group(1).strip().rstrip(",")
            waited = time.monotonic() - start
            # gloo says "failed to pass monitoredBarrier in <timeout> ms" also where the rank's
            # process ended at once (its connection closed): the wait says which it was.
            how = (
                f"did not arrive within {timeout_s:g} s ({setting})"
                if waited >= 0.9 * timeout_s
                else f"left the job after {waited:.1f} s of this wait, without arriving (its "
                f"process ended or its connection broke; the wait is up to {timeout_s:g} s, "
                f"{setting})"
            )
            raise RankMissing(
                f"{what}: rank{'s' if ',' in ranks else ''} {ranks} of {dist.get_world_size(group)} "
                f"{how}"
            ) from None
        raise RankMissing(
            f"{what}: the barrier failed on rank {dist.get_rank()} ({reason}); rank 0 names the "
            "ranks that did not arrive, unless it is the one lost (the launcher's last line names "
            "the rank that failed first)"
        ) from None


def shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
