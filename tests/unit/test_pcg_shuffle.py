"""The window shuffle's compiled permutation is numpy's own (dataloader/util/pcg_shuffle.py): every
pinned stream depends on it."""

from __future__ import annotations

import numpy as np
import pytest

from shardrec.dataloader.util import pcg_shuffle


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 255, 256, 257, 4099, 65536, 100_003])
def test_the_compiled_shuffle_is_numpys_permutation(n: int):
    for seed in ([0], [7, 1, 0x5EED, 3, 9], [2**63 + 5, 2, 1]):
        x = np.arange(n, dtype=np.int64) * 3 + 1
        expected = np.random.default_rng(seed).permutation(x)
        pcg_shuffle.shuffle(x, seed)
        assert np.array_equal(x, expected), (n, seed)


def test_draws_past_32_bits_are_numpys():
    """Bounds over 2**32 take 64-bit draws and leave the 32-bit spare alone: the draws equal
    numba's translation of numpy's random_interval over numpy's own PCG64, interleaved with
    32-bit bounds."""
    from numba import njit
    from numba.np.random import random_methods

    @njit
    def numpys(generator, bounds):
        out = np.empty(len(bounds), np.uint64)
        for k in range(len(bounds)):
            out[k] = random_methods.random_interval(generator.bit_generator, bounds[k])
        return out

    rng = np.random.default_rng(11)
    bounds = rng.integers(1, 2**40, 2000).astype(np.uint64)
    bounds[::3] = rng.integers(1, 2**20, len(bounds[::3])).astype(np.uint64)
    bounds[5] = 2**32 - 1
    bounds[6] = 2**32
    seed = [4, 5, 6]
    expected = numpys(np.random.default_rng(seed), bounds.copy())
    ours = bounds.copy()
    state = (np.uint64(v) for v in pcg_shuffle.pcg64_state(seed))
    pcg_shuffle.interval_draws(ours, *state)
    assert np.array_equal(ours, expected)


def test_a_full_64_bit_bound_takes_the_raw_draw():
    """Bound 2**64 - 1: the mask keeps every bit, the draw is PCG64's output as it is (numpy's
    integers over the full uint64 range returns the same raw draw; numba's translation of
    random_interval goes through a float there, so it is no reference)."""
    seed = [8, 9]
    ours = np.array([2**64 - 1] * 3, np.uint64)
    state = (np.uint64(v) for v in pcg_shuffle.pcg64_state(seed))
    pcg_shuffle.interval_draws(ours, *state)
    raw = np.random.default_rng(seed).integers(0, 2**64, 3, dtype=np.uint64)
    assert np.array_equal(ours, raw)
