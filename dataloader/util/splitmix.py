"""splitmix64's finalizer, the one hash of every id in the project, written once: preprocessing's
hashing mode and vocabularies, the spec path's string hash, and the managed tables' id maps (their
index, and a hashed table's rows) all mix with it.
"""

from __future__ import annotations

import numpy as np

from shardrec.dataloader.util.jit import njit

MIX_M1 = np.uint64(0xBF58476D1CE4E5B9)
MIX_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def mix64(values: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over a uint64 array (wrapping multiply is intended)."""
    z = values.astype(np.uint64, copy=True)
    z ^= z >> _S30
    z *= MIX_M1
    z ^= z >> _S27
    z *= MIX_M2
    z ^= z >> _S31
    return z


@njit(cache=True, nogil=True, inline="always")
def mix64_scalar(z):
    """splitmix64's finalizer of one uint64, for compiled kernels (mix64's arithmetic)."""
    z = (z ^ (z >> _S30)) * MIX_M1
    z = (z ^ (z >> _S27)) * MIX_M2
    return z ^ (z >> _S31)
