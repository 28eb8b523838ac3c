"""The rendezvous of a single-node job: a store on loopback only, on a port nobody can take first.

torchrun's c10d rendezvous, and its `--standalone` mode too, host the store in a TCPStore, which
listens on every interface whatever host it is given, and `--standalone` then opens a second
store for the ranks the same way. A single-node job needs neither: its agent opens one socket
bound to 127.0.0.1 on a port the kernel picks (held from that moment: no pick-release-bind
race), hands it to a TCPStore (`master_listen_fd`), and tells the ranks to use that store.
Registered with torchrun as the rendezvous backend `shardrec-loopback`; every job gets a fresh
rendezvous id, so no two jobs share keys.
"""

from __future__ import annotations

import socket
from datetime import timedelta

from torch.distributed import PrefixStore, Store, TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
)

from shardrec.trainer.distributed.dist import LOOPBACK


class LoopbackRendezvous(RendezvousHandler):
    """The only node of a job; its store accepts connections from this host only."""

    def __init__(self, run_id: str, timeout: timedelta, backend: str) -> None:
        self.run_id = run_id
        self.timeout = timeout
        self.backend = backend
        self._store: TCPStore | None = None

    def get_backend(self) -> str:
        return self.backend

    @property
    def use_agent_store(self) -> bool:
        return True  # the ranks join this store rather than opening one of their own

    def next_rendezvous(self) -> RendezvousInfo:
        if self._store is None:
            self._store = loopback_store(self.timeout)
        info = RendezvousStoreInfo(LOOPBACK, self._store.port)
        store: Store = PrefixStore(self.run_id, self._store)
        return RendezvousInfo(store, 0, 1, info)

    def is_closed(self) -> bool:
        return False

    def set_closed(self) -> None:
        pass

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return self.run_id

    def shutdown(self) -> bool:
        return True


def loopback_store(timeout: timedelta) -> TCPStore:
    """A store served on 127.0.0.1, on a port the kernel picks and the store holds from the
    start. The store takes the socket's descriptor (it closes it when it goes): the socket object
    lets go of it, so that no later close of it closes whatever file has that number by then."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOOPBACK, 0))
        sock.listen(128)
        store = TCPStore(
            LOOPBACK,
            sock.getsockname()[1],
            None,
            True,
            timeout,
            multi_tenant=True,
            master_listen_fd=sock.fileno(),
        )
    except BaseException:
        sock.close()
        raise
    sock.detach()
    return store


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    if params.max_nodes != 1:
        raise ValueError(
            f"the {params.backend} rendezvous is for one node, got --nnodes={params.max_nodes}"
        )
    timeout = timedelta(seconds=int(params.config.get("timeout", 600)))
    return LoopbackRendezvous(params.run_id, timeout, params.backend)


def register(backend: str) -> None:
    """Make `--rdzv-backend=BACKEND` (launch.RENDEZVOUS_BACKEND, named there so that the launcher
    builds the agent's command without torch) this rendezvous, for torchrun in this process."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(backend, create_handler)
