"""Batch memory recycled by the loader (dataloader/buffer_pool.py): never while anything holds it."""

from __future__ import annotations

import numpy as np
import torch

from shardrec.dataloader.buffer_pool import BufferPool


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


def test_the_pool_keeps_at_most_max_bytes_and_only_arrays_of_the_current_length():
    pool = BufferPool(np.int64, max_bytes=2 * 800)
    leases = [pool.take(100) for _ in range(3)]
    del leases
    assert pool.kept == 2
    small = pool.take(50)  # another length: the kept arrays no longer fit
    assert pool.kept == 0 and len(small) == 50
