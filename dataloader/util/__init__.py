"""The project's low-level utilities, used by every package: the one atomic file write (files.py),
one writer at a time through a lock file naming its holder (locks.py), the set-up of compiled
kernels (jit.py: numba's `njit`, or a no-op where numba does not import), splitmix64's finalizer,
the one hash of every id (splitmix.py), arrays handed out and taken back once nothing refers to them
(buffer_pool.py), the one "did you mean" of a mistyped name (near.py) and read-only memory maps that
keep no file descriptor open (mapping.py).

They live here only because dataloader is the lowest package: nothing in them is about batches.

May import: nothing of shardrec (the standard library, numpy and numba only).
"""
