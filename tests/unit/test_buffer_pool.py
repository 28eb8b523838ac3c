"""Batch memory recycled by the loader (dataloader/util/buffer_pool.py): never while anything holds
it."""

from __future__ import annotations

import gc
import threading

import numpy as np
import torch

from shardrec.dataloader.util.buffer_pool import BufferPool


def test_memory_returns_to_the_pool_only_when_no_view_or_tensor_holds_it():
    pool = BufferPool(np.int64, max_bytes=1 << 20)
    first = pool.take(100)
    first[:] = 7
    address = first.ctypes.data
    view, tensor = first[10:20], torch.from_numpy(first)[5:]
    del first
    assert pool.kept == 0
    other = pool.take(100)
    other[:] = 1
    assert other.ctypes.data != address and (view == 7).all() and bool((tensor == 7).all())
    del view
    assert pool.kept == 0  # the tensor still holds it
    del tensor
    assert pool.kept == 1 and pool.take(100).ctypes.data == address


def test_the_pool_keeps_at_most_max_bytes_serves_shorter_lengths_and_drops_shorter_arrays():
    pool = BufferPool(np.int64, max_bytes=2 * 800)
    leases = [pool.take(100) for _ in range(3)]
    addresses = {a.ctypes.data for a in leases}
    del leases
    assert pool.kept == 2
    small = pool.take(50)  # an epoch's last, shorter window: the front of a kept array
    assert len(small) == 50 and small.ctypes.data in addresses and pool.kept == 1
    del small
    assert pool.kept == 2
    large = pool.take(150)  # longer than the kept arrays: they no longer fit
    assert pool.kept == 0 and len(large) == 150
    del large
    assert pool.kept == 1 and len(pool.take(100)) == 100


def test_a_lease_freed_by_a_garbage_collection_inside_take_gives_its_memory_back(monkeypatch):
    pool = BufferPool(np.int64, max_bytes=1 << 20)
    cycle: list = [pool.take(100)]
    cycle.append(cycle)  # only the cyclic collector frees this lease
    del cycle
    real_empty = np.empty

    def collecting_empty(*args, **kwargs):
        # as an allocation may trigger: the lease's finalizer runs while take() holds the lock
        gc.collect()
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(np, "empty", collecting_empty)
    got: list = []
    gc.disable()
    try:
        taker = threading.Thread(target=lambda: got.append(pool.take(100)), daemon=True)
        taker.start()
        taker.join(timeout=10)
    finally:
        gc.enable()
    assert not taker.is_alive(), "take() deadlocked on its own lock"
    assert (
        pool.kept == 1 and len(got) == 1
    )  # the collected lease's memory is back; take() made another
