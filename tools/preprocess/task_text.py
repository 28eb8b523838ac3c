"""Text handed to worker processes in shared memory, and read back in the pieces a task parses.

A slot holds one range of a gzip file's text (gz_stream.py decodes into it); the worker reads
it in place. In a spawned worker, attaching registers the name with the parent's resource
tracker, which already holds it: the parent's unlink stays the only clean-up.
"""

from __future__ import annotations

from collections.abc import Iterator
from multiprocessing import shared_memory

import numpy as np

from shardrec.tools.preprocess.inputs import Task


class Slots:
    """Shared-memory buffers for ranges' text, reused as workers finish with them."""

    def __init__(self, count: int, size: int) -> None:
        self.shm = [shared_memory.SharedMemory(create=True, size=size) for _ in range(count)]
        for s in self.shm:
            _ATTACHED[s.name] = s  # a task run in this process reads its slot without attaching

    def grow(self, slot: int, have: int) -> None:
        # A line longer than the slack: a slot twice the size, holding what was decoded.
        old = self.shm[slot]
        new = shared_memory.SharedMemory(create=True, size=2 * old.size)
        new.buf[:have] = old.buf[:have]
        self.shm[slot] = _ATTACHED[new.name] = new
        self._free(old)

    def close(self) -> None:
        for s in self.shm:
            self._free(s)

    @staticmethod
    def _free(s: shared_memory.SharedMemory) -> None:
        _ATTACHED.pop(s.name, None)
        s.unlink()
        try:
            s.close()
        except BufferError:  # a view still held (by an input error's traceback): unmapped at exit
            _UNCLOSED.append(s)


_ATTACHED: dict[str, shared_memory.SharedMemory] = {}  # slot name -> its mapping in this process
_UNCLOSED: list[shared_memory.SharedMemory] = []


def _slot_view(name: str, size: int) -> memoryview:
    if name not in _ATTACHED:
        if len(_ATTACHED) > 16:  # slots replaced by grown ones: drop the stale mappings
            for s in _ATTACHED.values():
                s.close()
            _ATTACHED.clear()
        # Attached in a spawned worker, it registers with the parent's resource tracker, which
        # already holds the name: the parent's unlink stays the only clean-up.
        _ATTACHED[name] = shared_memory.SharedMemory(name=name)
    return _ATTACHED[name].buf[:size]


def slot_pieces(task: Task, piece_bytes: int) -> Iterator[memoryview]:
    """The task's text from its slot in pieces ending at a newline, cut where read_pieces cuts
    the same range of a plain file (parts close on pieces: the bytes depend on the cuts)."""
    size = task.end - task.start
    view = _slot_view(task.text_slot, size + 1)  # one byte past: the producer's closing newline
    arr = np.frombuffer(view, dtype=np.uint8)
    whole = size + int(
        arr[size - 1] != 10
    )  # a last line without a newline is yielded closed, alone
    pos, window = 0, piece_bytes
    try:
        while pos < size:
            hi = min(pos + window, size)
            cut = hi if hi == size and arr[size - 1] == 10 else _last_newline(arr, pos, hi)
            if cut < 0:  # no newline in the window: read_pieces grows its buffer to 2x + 1
                if hi == size:
                    break
                window = 2 * window + 1
                continue
            yield view[pos:cut]
            pos = cut
        if pos < size:
            yield view[pos:whole]
    finally:
        del arr  # the mapping cannot close while a view of it is alive


def _last_newline(arr: np.ndarray, lo: int, hi: int) -> int:
    # One past the last newline in arr[lo:hi], or -1; lines are short: look back a little first.
    for start in (max(lo, hi - 4096), lo):
        nl = np.flatnonzero(arr[start:hi] == 10)
        if len(nl):
            return start + int(nl[-1]) + 1
    return -1
