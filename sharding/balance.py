"""Balancing pieces over ranks: LPT packing, single-table moves and piece swaps.

Everything is deterministic: ties break by table order and rank, so the same inputs always
give the same placement.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from shardrec.sharding.comms import collectives_per_step
from shardrec.sharding.options import PIECE_TYPES, Option, Piece, Problem


@dataclass
class Assignment:
    choice: list[Option]
    step: np.ndarray
    mem: np.ndarray
    ranks: list[list[int]]
    """Per table: the rank of each column block (piece types) or the host (table_row_wise)."""
    latency_s: float = 0.0
    """Start-up cost of the collectives of every sharding type in use (cost.collective_latency)."""
    infeasible: int = -1
    """A table that fit nowhere, or -1."""

    @property
    def score(self) -> float:
        return float("inf") if self.infeasible >= 0 else float(self.step.max()) + self.latency_s


def place_spreads(p: Problem, choice: list[Option], step: np.ndarray, mem: np.ndarray, ranks: list[list[int]]) -> None:
    H = p.topo.local_world_size
    spreads = [i for i, o in enumerate(choice) if o.sharding_type not in PIECE_TYPES]
    for i in sorted(spreads, key=lambda i: (-p.work(i, choice[i]), i)):
        s, m = p.spread(i, choice[i].sharding_type)
        if choice[i].sharding_type == "table_row_wise":
            hosts = p.hosts_allowed(i)
            host = min(hosts, key=lambda h: (float(step[h * H:(h + 1) * H].sum()), h))
            s, m = np.roll(s, host * H), np.roll(m, host * H)
            ranks[i] = [host]
        step += s
        mem += m


def assign(p: Problem, choice: list[Option]) -> Assignment:
    """LPT: spreads first, then pieces from the costliest, each on the least-loaded rank with room."""
    topo, W, H, cap = p.topo, p.topo.world_size, p.topo.local_world_size, p.topo.memory_bytes
    step, mem = np.zeros(W), np.zeros(W)
    ranks: list[list[int]] = [[] for _ in choice]
    place_spreads(p, choice, step, mem, ranks)
    pieces = []
    for i, o in enumerate(choice):
        if o.sharding_type in PIECE_TYPES:
            pc = p.piece(i, o.shards)
            step += o.shards * pc.other_s  # every rank's share of the all-to-all; the owner's is corrected below
            pieces.append((-(pc.owner_s - pc.other_s), i))
    pieces.sort()
    heap = [(float(step[r]), r) for r in range(W)]
    heapq.heapify(heap)
    for _, i in pieces:
        o, pc = choice[i], p.piece(i, choice[i].shards)
        extra = pc.owner_s - pc.other_s
        allowed = None if not p.cons[i].ranks else set(p.cons[i].ranks)
        if o.sharding_type == "table_column_wise":
            hosts = p.hosts_allowed(i)
            host = min(hosts, key=lambda h: (float(step[h * H:(h + 1) * H].sum()), h))
            allowed = set(range(host * H, (host + 1) * H))
        for _ in range(o.shards):
            r = pop_rank(heap, step, mem, pc.mem, cap, allowed)
            if r < 0:
                return Assignment(choice, step, mem, ranks, infeasible=i)
            step[r] += extra
            mem[r] += pc.mem
            ranks[i].append(r)
            heapq.heappush(heap, (float(step[r]), r))
    return Assignment(choice, step, mem, ranks, type_latency(p, choice))


def pop_rank(heap, step, mem, need: float, cap: float, allowed: set[int] | None) -> int:
    """Pop the least-loaded rank that may hold the piece and has memory for it; -1 if none."""
    skipped, found = [], -1
    while heap:
        load, r = heapq.heappop(heap)
        if load != step[r]:
            continue  # stale entry
        if (allowed is None or r in allowed) and mem[r] + need <= cap:
            found = r
            break
        skipped.append((load, r))
    for item in skipped:
        heapq.heappush(heap, item)
    return found


def type_latency(p: Problem, choice: list[Option]) -> float:
    """Start-up cost of the collectives of every sharding type in use (cost.collective_latency)."""
    if p.topo.world_size == 1:
        return 0.0
    return collectives_per_step({o.sharding_type for o in choice}, p.topo.num_hosts) * p.latency_per_type_s


def move_table(p: Problem, a: Assignment, i: int, o: Option) -> Assignment:
    """`a` with table i switched to option o, its new pieces put on the least-loaded ranks (no re-balance)."""
    step, mem, ranks = a.step.copy(), a.mem.copy(), list(a.ranks)
    H, cap = p.topo.local_world_size, p.topo.memory_bytes
    old = a.choice[i]
    if old.sharding_type in PIECE_TYPES:
        pc = p.piece(i, old.shards)
        step -= old.shards * pc.other_s
        for r in a.ranks[i]:
            step[r] -= pc.owner_s - pc.other_s
            mem[r] -= pc.mem
    else:
        s, m = p.spread(i, old.sharding_type)
        shift = a.ranks[i][0] * H if old.sharding_type == "table_row_wise" else 0
        step -= np.roll(s, shift)
        mem -= np.roll(m, shift)
    choice = a.choice[:i] + [o] + a.choice[i + 1:]
    if o.sharding_type not in PIECE_TYPES:
        s, m = p.spread(i, o.sharding_type)
        ranks[i] = []
        if o.sharding_type == "table_row_wise":
            host = min(p.hosts_allowed(i), key=lambda h: (float(step[h * H:(h + 1) * H].sum()), h))
            s, m, ranks[i] = np.roll(s, host * H), np.roll(m, host * H), [host]
        step += s
        mem += m
        return Assignment(choice, step, mem, ranks, type_latency(p, choice))
    pc = p.piece(i, o.shards)
    step += o.shards * pc.other_s
    mask = np.zeros(p.topo.world_size, dtype=bool)
    if o.sharding_type == "table_column_wise":
        host = min(p.hosts_allowed(i), key=lambda h: (float(step[h * H:(h + 1) * H].sum()), h))
        mask[host * H:(host + 1) * H] = True
    else:
        mask[p.allowed_ranks(i)] = True
    placed = []
    for _ in range(o.shards):
        load = np.where(mask & (mem + pc.mem <= cap), step, np.inf)
        r = int(np.argmin(load))
        if not np.isfinite(load[r]):
            return Assignment(choice, step, mem, ranks, 0.0, infeasible=i)
        step[r] += pc.owner_s - pc.other_s
        mem[r] += pc.mem
        placed.append(r)
    ranks[i] = placed
    return Assignment(choice, step, mem, ranks, type_latency(p, choice))


def refine_ranks(p: Problem, a: Assignment, max_moves: int) -> Assignment:
    """Move or swap single pieces between the slowest and the fastest ranks while that helps."""
    if a.infeasible >= 0:
        return a
    step, mem, ranks, cap = a.step.copy(), a.mem.copy(), [list(r) for r in a.ranks], p.topo.memory_bytes
    H = p.topo.local_world_size
    where: dict[int, list[tuple[int, int]]] = {}  # rank -> (table, block index)
    for i, o in enumerate(a.choice):
        if o.sharding_type in PIECE_TYPES:
            for j, r in enumerate(ranks[i]):
                where.setdefault(r, []).append((i, j))

    def ok(i: int, r: int, src: int) -> bool:
        o = a.choice[i]
        if p.cons[i].ranks and r not in p.cons[i].ranks:
            return False
        return o.sharding_type != "table_column_wise" or r // H == src // H

    def piece(i: int) -> Piece:
        return p.piece(i, a.choice[i].shards)

    for _ in range(max_moves):
        hi, lo = int(np.argmax(step)), int(np.argmin(step))
        gap = step[hi] - step[lo]
        best = None  # (new max of the pair, table, block, swap partner or None)
        for i, j in where.get(hi, []):
            x = piece(i).owner_s - piece(i).other_s
            if x < gap and ok(i, lo, hi) and mem[lo] + piece(i).mem <= cap:
                cand = (max(step[hi] - x, step[lo] + x), i, j, None)
                best = cand if best is None or cand[0] < best[0] else best
            for k, m in where.get(lo, []):
                y = piece(k).owner_s - piece(k).other_s
                if 0 < x - y < gap and ok(i, lo, hi) and ok(k, hi, lo) \
                        and mem[lo] - piece(k).mem + piece(i).mem <= cap and mem[hi] - piece(i).mem + piece(k).mem <= cap:
                    cand = (max(step[hi] - x + y, step[lo] + x - y), i, j, (k, m))
                    best = cand if best is None or cand[0] < best[0] else best
        if best is None or best[0] >= step[hi] * (1 - 1e-12):
            break
        _, i, j, partner = best
        moves = [(i, j, hi, lo)] + ([(partner[0], partner[1], lo, hi)] if partner else [])
        for t, b, src, dst in moves:
            pc = piece(t)
            d = pc.owner_s - pc.other_s
            step[src] -= d
            step[dst] += d
            mem[src] -= pc.mem
            mem[dst] += pc.mem
            ranks[t][b] = dst
            where[src].remove((t, b))
            where.setdefault(dst, []).append((t, b))
    return Assignment(a.choice, step, mem, ranks, a.latency_s)
