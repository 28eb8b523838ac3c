"""Arrays handed out for batches and taken back once nothing refers to them any more.

A multi-hot batch of DLRMv2's sizes holds ~14 MB of int64 ids (214 per sample, 8192 samples), and
one gather of Criteo one-hot batches as much (8 batches of 8192 x 26 ids). A fresh array per batch
costs the kernel's page faults and the zeroing of every page on first touch (glibc gives such
arrays back to the kernel and maps them again), a large share of the loader's CPU time as system
time. The pool keeps the memory of
batches the consumer has released and writes the next batch there.

Released means provably released: a lease is an array that does not own its memory (a view,
through a memoryview, of an array the pool keeps), so every numpy view of it names it as its
base and every tensor `torch.from_numpy` makes of it (or of a view of it) holds it. Its memory
returns to the pool only when the lease itself is freed, that is when no array, tensor or
view that shares the memory is left. A batch the consumer keeps is never written over.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

__all__ = ["BufferPool"]


class BufferPool:
    """Uninitialised 1-d arrays of one dtype, recycled once every user has let go of them.

    Thread-safe: loader threads take arrays while the consumer's thread releases them.
    """

    def __init__(self, dtype: np.dtype | type, max_bytes: int) -> None:
        """`max_bytes`: memory of released arrays kept for reuse (beyond it they are freed)."""
        self.dtype, self.max_bytes = np.dtype(dtype), max_bytes
        self._free: list[np.ndarray] = []
        self._length = -1
        # Re-entrant: a garbage collection while take() holds the lock may free a lease in a
        # reference cycle, and its finalizer gives the memory back from the same thread.
        self._lock = threading.RLock()

    def take(self, length: int) -> np.ndarray:
        """A writable array of `length` values whose contents are undefined (as np.empty's).

        Kept arrays all have the longest length asked for so far; a shorter request (the last
        window of an epoch) gets the front of one, so alternating lengths do not empty the pool."""
        with self._lock:
            if length > self._length:  # longer than the kept arrays: they do not fit
                self._free, self._length = [], length
            owner = self._free.pop() if self._free else np.empty(self._length, self.dtype)
        lease = np.frombuffer(memoryview(owner), self.dtype, count=length)
        weakref.finalize(lease, self._give_back, owner).atexit = False
        return lease

    def _give_back(self, owner: np.ndarray) -> None:
        with self._lock:
            if (
                len(owner) == self._length
                and (len(self._free) + 1) * owner.nbytes <= self.max_bytes
            ):
                self._free.append(owner)

    @property
    def kept(self) -> int:
        """Released arrays waiting for reuse."""
        with self._lock:
            return len(self._free)
