"""Compiled kernels of the event loader: an anchor's history, gathered causally, and the hashed
crosses of its features.

History ("interleaved", DLRMv4's reference): look back over at most `scan` events of the user
before the anchor, keep the last `per_pool` of each pool (listen-plus, like, skip: an event's
action bit), and give them back in time order; events without a pool (dislikes, unlikes, ...)
are passed over but count in the scan. "last_n": the last `length` pooled events. One pass
backwards per anchor, so each pool stops when full; the like pool is rarely full, so an anchor
costs up to min(scan, its user's events before it).

Crosses: xxh64 with seed 0 of the keys written as little-endian int64, modulo the cross's size
(the reference hashes the same bytes with the xxhash package). Written here from the xxHash
specification for inputs under 32 bytes (crosses have at most three keys);
tests/unit/test_event_loader.py holds values computed with the xxhash package.
"""

from __future__ import annotations

import numpy as np

from shardrec.dataloader.util.jit import njit

LISTEN_PLUS, LIKE, SKIP = 1, 2, 4
"""Action bits of an event (its pool): a listen played past the threshold, a like, any other
listen."""
P1 = np.uint64(0x9E3779B185EBCA87)
P2 = np.uint64(0xC2B2AE3D27D4EB4F)
P3 = np.uint64(0x165667B19E3779F9)
P4 = np.uint64(0x85EBCA77C2B2AE63)
P5 = np.uint64(0x27D4EB2F165667C5)


@njit(cache=True, nogil=True, inline="always")
def _rotl(x, r):
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@njit(cache=True, nogil=True)
def xxh64_rows(keys, seed, modulo, out):
    """out[i] = xxh64(seed, keys[i] as little-endian int64 words) % modulo, keys [n, k], k <= 3."""
    k = keys.shape[1]
    length = np.uint64(8 * k)
    for i in range(keys.shape[0]):
        acc = np.uint64(seed) + P5 + length
        for j in range(k):
            lane = np.uint64(keys[i, j])
            lane = _rotl(lane * P2, 31) * P1
            acc = _rotl(acc ^ lane, 27) * P1 + P4
        acc ^= acc >> np.uint64(33)
        acc *= P2
        acc ^= acc >> np.uint64(29)
        acc *= P3
        acc ^= acc >> np.uint64(32)
        out[i] = acc % np.uint64(modulo)


@njit(cache=True, nogil=True)
def gather_histories(anchor, first, action, scan, per_pool, last_n, out_pos, out_len):
    """Each anchor's kept history as event positions in time order.

    Args:
        anchor: [n] the anchor's event position; first: [n] its user's first event position.
        action: [events] action bits (0: in no pool).
        scan: events looked back at most; per_pool: kept per pool (interleaved);
        last_n: > 0 keeps the last `last_n` pooled events instead.
        out_pos: [n, width] positions written; out_len: [n] how many.
    """
    for i in range(anchor.shape[0]):
        e = anchor[i]
        lo = max(first[i], e - scan)
        n = 0
        c1, c2, c4 = 0, 0, 0
        j = e - 1
        while j >= lo:
            a = action[j]
            if last_n > 0:
                if a != 0:
                    out_pos[i, n] = j
                    n += 1
                    if n == last_n:
                        break
            else:
                if c1 >= per_pool and c2 >= per_pool and c4 >= per_pool:
                    break
                take = False
                if a == LISTEN_PLUS and c1 < per_pool:
                    c1 += 1
                    take = True
                elif a == LIKE and c2 < per_pool:
                    c2 += 1
                    take = True
                elif a == SKIP and c4 < per_pool:
                    c4 += 1
                    take = True
                if take:
                    out_pos[i, n] = j
                    n += 1
            j -= 1
        for a in range(n // 2):  # backwards -> time order
            t = out_pos[i, a]
            out_pos[i, a] = out_pos[i, n - 1 - a]
            out_pos[i, n - 1 - a] = t
        out_len[i] = n
