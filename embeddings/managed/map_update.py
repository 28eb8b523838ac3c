"""An id map's update: the combined statistics applied, old ids evicted, waiting ids admitted into
the freed slots. Integer arithmetic with every tie broken by the id, so each rank computes the
same map from the same combined statistics (id_map.combine).

Order of the steps, at update step `now`:
1. apply: each slot's count += its hits, its last = the later of its last and the newest hit;
   the ids missed join the waiting ids (counts summed, lasts maxed, by id);
2. age: with a max age, slots (and waiting ids) last seen before `horizon` are freed (dropped);
3. admit: waiting ids seen at least `admit` times, best first (lru: latest seen, then most seen;
   lfu and age: most seen, then latest), take the free slots; with lru or lfu the rest may each
   take a used slot from its worst holder (lru: seen longest ago; lfu: seen least), pairing the
   best waiting id with the worst holder, while the waiting id is strictly better (later seen for
   lru, more often for lfu: no swapping of equals);
4. assign: the freed slots, in ascending order, go to the admitted ids in their order; each new
   slot's generation is `now` (its row is re-initialised: row_reset);
5. the waiting ids left are cut to the `capacity` best (most seen, then latest, then id);
6. at a new day's first update, with a `decay`, every slot's and waiting id's count is shifted
   right by `decay` bits: after the admissions, so that the ids met late in yesterday's data still
   get their slots on yesterday's counts, and today's sightings then weigh 2^decay times
   yesterday's (an exponential forgetting that stays integer, the same on every rank).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardrec.embeddings.managed.id_map import IdMap, Pending
from shardrec.embeddings.managed.map_kernels import EMPTY, merge_sorted


@dataclass(frozen=True)
class UpdateRule:
    """How one map updates (from its table's settings)."""

    admit: int
    """Sightings before admission."""
    policy: str
    """lru, lfu or age."""
    evicts: bool
    """Whether an admitted id may take a used slot (lru, lfu)."""
    capacity: int
    """Waiting ids kept."""
    decay: int = 0
    """Bits the counts are shifted right by after a new day's first update."""


@dataclass(frozen=True)
class UpdateResult:
    """What an update did: the slots whose id changed (their rows to reset) and its counts."""

    reassigned: np.ndarray
    """int64, ascending: slots given to a new id."""
    admitted: int
    evicted: int
    """Ids that lost their slot (aged out, or taken by a better one)."""
    hits: int
    """Lookups of the window on an id's own row."""
    misses: int
    """Lookups of the window on the shared row."""


def apply_update(
    idmap: IdMap,
    pending: Pending,
    now: int,
    rule: UpdateRule,
    horizon: int | None,
    new_day: bool = False,
) -> UpdateResult:
    """Update `idmap` in place with every rank's combined `pending` statistics (see the module
    docstring); `horizon`: ids last seen before this step lose their slot (None: no max age);
    `new_day`: this is a new day's first update (the counts decay after it)."""
    m = idmap
    m.slot_count += pending.hits
    np.maximum(m.slot_last, pending.lasts, out=m.slot_last)
    # Both lists are sorted by id, each id once: one linear merge.
    keys, counts, lasts = merge_sorted(
        m.cand_key,
        m.cand_count,
        m.cand_last,
        pending.miss_keys,
        pending.miss_counts,
        pending.miss_lasts,
    )
    used = m.slot_key != EMPTY
    evicted = 0
    removed = [np.zeros(0, np.uint64)]
    if horizon is not None:
        expired = used & (m.slot_last < horizon)
        evicted += int(expired.sum())
        removed.append(m.slot_key[expired])
        _free(m, expired)
        fresh = lasts >= horizon
        keys, counts, lasts = keys[fresh], counts[fresh], lasts[fresh]
    eligible = np.flatnonzero(counts >= rule.admit)
    order = eligible[_rank_waiting(keys[eligible], counts[eligible], lasts[eligible], rule.policy)]
    free = np.flatnonzero(m.slot_key == EMPTY)
    taken = np.zeros(0, np.int64)
    if rule.evicts and len(order) > len(free):
        rest = order[len(free) :]
        holders = np.flatnonzero(m.slot_key != EMPTY)
        worst = holders[_rank_holders(m, holders, rule.policy)]
        k = min(len(rest), len(worst))
        if rule.policy == "lru":
            better = lasts[rest[:k]] > m.slot_last[worst[:k]]
        else:
            better = counts[rest[:k]] > m.slot_count[worst[:k]]
        # Waiting ids get worse and holders better along the pairs: the wins are a prefix.
        k = int(np.argmin(better)) if not better.all() else k
        taken = np.sort(worst[:k])
        evicted += k
        removed.append(m.slot_key[taken])
        mask = np.zeros(m.rows, bool)
        mask[taken] = True
        _free(m, mask)
        free = np.flatnonzero(m.slot_key == EMPTY)
    admitted = order[: len(free)]
    slots = free[: len(admitted)]
    m.slot_key[slots] = keys[admitted]
    m.slot_count[slots] = counts[admitted]
    m.slot_last[slots] = lasts[admitted]
    m.slot_born[slots] = now
    waiting = np.ones(len(keys), bool)
    waiting[admitted] = False
    keys, counts, lasts = keys[waiting], counts[waiting], lasts[waiting]
    if len(keys) > rule.capacity:
        keep = np.sort(np.lexsort((keys, -lasts, -counts))[: rule.capacity])
        keys, counts, lasts = keys[keep], counts[keep], lasts[keep]
    if new_day and rule.decay:
        m.slot_count >>= rule.decay
        counts = counts >> rule.decay
    m.cand_key, m.cand_count, m.cand_last = keys, counts, lasts
    m.reindex(np.concatenate(removed), slots)
    m.clear_pending()
    return UpdateResult(
        reassigned=np.sort(slots).astype(np.int64),
        admitted=len(slots),
        evicted=evicted,
        hits=int(pending.hits.sum()),
        misses=int(pending.miss_counts.sum()),
    )


def _free(m: IdMap, mask: np.ndarray) -> None:
    m.slot_key[mask] = EMPTY
    m.slot_count[mask] = 0
    m.slot_last[mask] = -1


def _rank_waiting(keys: np.ndarray, counts: np.ndarray, lasts: np.ndarray, policy: str):
    """Order of waiting ids, best first (np.lexsort: last key primary)."""
    if policy == "lru":
        return np.lexsort((keys, -counts, -lasts))
    return np.lexsort((keys, -lasts, -counts))


def _rank_holders(m: IdMap, holders: np.ndarray, policy: str):
    """Order of used slots, worst holder first."""
    key, last, count = m.slot_key[holders], m.slot_last[holders], m.slot_count[holders]
    if policy == "lru":
        return np.lexsort((key, count, last))
    return np.lexsort((key, last, count))
