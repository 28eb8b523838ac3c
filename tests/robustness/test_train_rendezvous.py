"""A single-node run rendezvous on loopback only (README, Failures and trust: Training), through a
store whose port is never released between its choice and its use, under a fresh id for every
job."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from shardrec.trainer.distributed.launch import torchrun_command


def _flags(command: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in command if a.startswith("--") and "=" in a)


def test_the_local_command_binds_loopback_with_a_fresh_id_per_job() -> None:
    first, second = (
        _flags(torchrun_command(["--steps", "1"], 2)),
        _flags(torchrun_command(["--steps", "1"], 2)),
    )
    assert first["rdzv-backend"] == "shardrec-loopback"
    assert (
        first["rdzv-endpoint"] == "127.0.0.1:0"
    )  # the kernel picks the port when the store binds it
    assert first["local-addr"] == "127.0.0.1"  # what the ranks are told to connect to
    assert first["rdzv-id"] != second["rdzv-id"] and len(first["rdzv-id"]) == 32
    # Several nodes share an endpoint and must share the id: derived from the endpoint.
    nodes = [
        _flags(torchrun_command([], 1, nnodes=2, rdzv_endpoint="10.0.0.1:29400")) for _ in range(2)
    ]
    assert nodes[0]["rdzv-backend"] == "c10d" and nodes[0]["rdzv-id"] == nodes[1]["rdzv-id"]


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp* shows them) listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                found.append(local.rsplit(":", 1)[0])
    return found


@pytest.mark.skipif(
    not Path("/proc/net/tcp").exists(), reason="reads listening sockets from /proc/net"
)
def test_the_store_listens_on_loopback_only() -> None:
    from shardrec.trainer.distributed.launch import RENDEZVOUS_BACKEND
    from shardrec.trainer.distributed.rendezvous import LoopbackRendezvous

    handler = LoopbackRendezvous("job-1", timedelta(seconds=10), RENDEZVOUS_BACKEND)
    info = handler.next_rendezvous()
    port = info.bootstrap_store_info.master_port
    assert info.bootstrap_store_info.master_addr == "127.0.0.1"
    assert _listening(port) == ["0100007F"]  # 127.0.0.1, and no 0.0.0.0 or [::]
    info.store.set("k", "v")
    assert handler.next_rendezvous().store.get("k") == b"v"  # a restart round reuses the one store
