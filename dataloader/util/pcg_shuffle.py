"""numpy's `default_rng(seed).shuffle(x)` of a 1-d array, the same permutation, compiled.

The shuffle's windows (order.py) are permuted by numpy's Generator: Fisher-Yates from the last
item down, each index drawn by `random_interval` (the smallest all-ones mask over the bound, a
32-bit draw while the bound fits 32 bits, else a 64-bit one, rejected until it is within the
bound) from PCG64 (a 128-bit LCG step, then XSL-RR output; a 64-bit output gives two 32-bit
draws, low half first). numpy calls its bit generator through a function pointer for every
draw, ~9 ns an item; here the LCG step is inlined (LLVM's 128-bit multiply), ~2x faster, and
the draws, and so the permutation, are numpy's own: every pinned stream stays as it was
(tests/unit/test_pcg_shuffle.py holds them equal over many seeds and sizes, and the draws of
64-bit bounds to numba's translation of numpy's).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from shardrec.dataloader.util.jit import AVAILABLE, njit

if AVAILABLE:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic
else:

    def intrinsic(f):
        return f


MULTIPLIER = 0x2360ED051FC65DA44385DF649FCCF645
"""PCG's default 128-bit LCG multiplier (numpy's PCG64)."""
_M64 = (1 << 64) - 1


@intrinsic
def _step(typingctx, hi, lo, inc_hi, inc_lo):
    """The LCG's next state: (hi, lo) * MULTIPLIER + (inc_hi, inc_lo), modulo 2**128."""
    u64 = types.uint64

    def codegen(context, builder, signature, args):
        wide = ir.IntType(128)
        sixty_four = ir.Constant(wide, 64)

        def join(high, low):
            return builder.or_(
                builder.shl(builder.zext(high, wide), sixty_four), builder.zext(low, wide)
            )

        state = builder.add(
            builder.mul(join(args[0], args[1]), ir.Constant(wide, MULTIPLIER)),
            join(args[2], args[3]),
        )
        narrow = ir.IntType(64)
        parts = [
            builder.trunc(builder.lshr(state, sixty_four), narrow),
            builder.trunc(state, narrow),
        ]
        return context.make_tuple(builder, signature.return_type, parts)

    return types.UniTuple(u64, 2)(u64, u64, u64, u64), codegen


@njit(inline="always", nogil=True)
def _output(hi, lo):
    """PCG64's XSL-RR output of a state: (hi ^ lo) rotated right by hi's top 6 bits."""
    value = hi ^ lo
    rot = hi >> np.uint64(58)
    return (value >> rot) | (value << ((np.uint64(64) - rot) & np.uint64(63)))


@njit(inline="always", nogil=True)
def _mask(bound):
    """The smallest all-ones mask >= bound."""
    mask = bound
    for shift in (1, 2, 4, 8, 16, 32):
        mask |= mask >> np.uint64(shift)
    return mask


@njit(inline="always", nogil=True)
def _interval(bound, hi, lo, inc_hi, inc_lo, has32, spare):
    """numpy's random_interval(bound): (the draw, then the generator's state hi, lo, has32,
    spare). Under 2**32 a 32-bit draw (a 64-bit output's low half, its high half kept for the
    next); else a 64-bit one, which leaves the kept half alone."""
    mask = _mask(bound)
    low32 = np.uint64(0xFFFFFFFF)
    if bound <= low32:
        while True:
            if has32:
                value, has32 = spare, False
            else:
                hi, lo = _step(hi, lo, inc_hi, inc_lo)
                out = _output(hi, lo)
                value, spare, has32 = out & low32, out >> np.uint64(32), True
            value &= mask
            if value <= bound:
                return value, hi, lo, has32, spare
    while True:
        hi, lo = _step(hi, lo, inc_hi, inc_lo)
        value = _output(hi, lo) & mask
        if value <= bound:
            return value, hi, lo, has32, spare


@njit(cache=True, nogil=True, boundscheck=False)
def shuffle_pcg64(x, hi, lo, inc_hi, inc_lo):
    """Shuffle 1-d x in place as numpy's Generator.shuffle does from a fresh PCG64 of state
    (hi, lo) and increment (inc_hi, inc_lo)."""
    has32, spare = False, np.uint64(0)
    for k in range(len(x) - 1, 0, -1):
        value, hi, lo, has32, spare = _interval(np.uint64(k), hi, lo, inc_hi, inc_lo, has32, spare)
        j = np.intp(value)
        held = x[j]
        x[j] = x[k]
        x[k] = held


@njit(cache=True, nogil=True)
def interval_draws(bounds, hi, lo, inc_hi, inc_lo):
    """bounds[k] replaced by numpy's random_interval(bounds[k]), in order, from a fresh PCG64 of
    that state: the draws shuffle_pcg64 makes, for bounds of any size."""
    has32, spare = False, np.uint64(0)
    for k in range(len(bounds)):
        value, hi, lo, has32, spare = _interval(
            np.uint64(bounds[k]), hi, lo, inc_hi, inc_lo, has32, spare
        )
        bounds[k] = value


def pcg64_state(seed: Sequence[int]) -> tuple[int, int, int, int]:
    """(hi, lo, inc_hi, inc_lo) of numpy's PCG64 seeded as `np.random.default_rng(seed)` is."""
    state = np.random.PCG64(seed).state["state"]
    s, inc = int(state["state"]), int(state["inc"])
    return s >> 64, s & _M64, inc >> 64, inc & _M64


def shuffle(x: np.ndarray, seed: Sequence[int]) -> None:
    """`np.random.default_rng(seed).shuffle(x)` for a 1-d array, in place (the order that
    `default_rng(seed).permutation(x)` returns), compiled where numba imports."""
    if not AVAILABLE or x.ndim != 1 or not len(x):
        np.random.default_rng(seed).shuffle(x)
        return
    shuffle_pcg64(x, *(np.uint64(v) for v in pcg64_state(seed)))
