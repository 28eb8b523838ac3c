"""Balancing pieces over ranks: LPT packing, single-table moves and piece swaps.

Everything is deterministic: ties break by table order and rank, so the same inputs always
give the same placement. Tables are referred to by their index in `Problem.configs`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from shardrec.sharding.cost.comms import collectives_per_step
from shardrec.sharding.search.options import PIECE_TYPES, Option, Piece, Problem


@dataclass
class Assignment:
    choice: list[Option]
    """Per table: its chosen sharding option."""
    step: np.ndarray
    """Per rank: estimated step seconds."""
    mem: np.ndarray
    """Per rank: estimated memory bytes."""
    ranks: list[list[int]]
    """Per table: the rank of each column block (piece types) or the host (table_row_wise)."""
    latency_s: float = 0.0
    """Start-up cost of the collectives of every sharding type in use (cost.collective_latency)."""
    infeasible: int = -1
    """A table that fit nowhere, or -1."""

    @property
    def score(self) -> float:
        return float("inf") if self.infeasible >= 0 else float(self.step.max()) + self.latency_s


def _least_loaded_host(hosts: list[int], step: np.ndarray, host_size: int) -> int:
    """The host whose ranks add up to the least step time (ties: the lowest host)."""
    return min(
        hosts, key=lambda host: (float(step[host * host_size : (host + 1) * host_size].sum()), host)
    )


def place_spreads(
    problem: Problem,
    choice: list[Option],
    step: np.ndarray,
    mem: np.ndarray,
    ranks: list[list[int]],
) -> None:
    """Add every spread option's per-rank cost to `step` and `mem`, costliest first; table-row-wise
    tables go to the least-loaded host they may use."""
    host_size = problem.topo.local_world_size
    spreads = [
        index for index, option in enumerate(choice) if option.sharding_type not in PIECE_TYPES
    ]
    for index in sorted(spreads, key=lambda index: (-problem.work(index, choice[index]), index)):
        spread_step, spread_mem = problem.spread(index, choice[index].sharding_type)
        if choice[index].sharding_type == "table_row_wise":
            host = _least_loaded_host(problem.hosts_allowed(index), step, host_size)
            spread_step, spread_mem = (
                np.roll(spread_step, host * host_size),
                np.roll(spread_mem, host * host_size),
            )
            ranks[index] = [host]
        step += spread_step
        mem += spread_mem


def assign(problem: Problem, choice: list[Option]) -> Assignment:
    """LPT: spreads first, then pieces from the costliest, each on the least-loaded rank with
    room."""
    world_size, host_size = problem.topo.world_size, problem.topo.local_world_size
    capacity = problem.capacity
    step, mem = np.zeros(world_size), np.zeros(world_size)
    ranks: list[list[int]] = [[] for _ in choice]
    place_spreads(problem, choice, step, mem, ranks)
    if (mem > capacity).any():  # the spreads alone overflow a rank: name the one needing the most
        spreads = [i for i, option in enumerate(choice) if option.sharding_type not in PIECE_TYPES]
        worst = max(spreads, key=lambda i: (problem.max_memory(i, choice[i]), -i)) if spreads else 0
        return Assignment(choice, step, mem, ranks, infeasible=worst)
    pieces = []
    for index, option in enumerate(choice):
        if option.sharding_type in PIECE_TYPES:
            piece = problem.piece(index, option.shards)
            step += (
                option.shards * piece.other_s
            )  # every rank's share of the all-to-all; the owner's is corrected below
            pieces.append((-(piece.owner_s - piece.other_s), index))
    pieces.sort()
    heap = [(float(step[rank]), rank) for rank in range(world_size)]
    heapq.heapify(heap)
    for _, index in pieces:
        option, piece = choice[index], problem.piece(index, choice[index].shards)
        extra = piece.owner_s - piece.other_s
        allowed = None if not problem.cons[index].ranks else set(problem.cons[index].ranks)
        if option.sharding_type == "table_column_wise":
            host = _least_loaded_host(problem.hosts_allowed(index), step, host_size)
            allowed = set(range(host * host_size, (host + 1) * host_size))
        for block in range(option.shards):
            free = allowed
            if block and block == option.shards - 1 and len(set(ranks[index])) == 1:
                # A table's column blocks span two ranks at least: all on one, the cut would buy
                # nothing a whole table there does not (several on one rank still even out
                # loads, as torchrec allows).
                free = (set(range(world_size)) if allowed is None else allowed) - set(ranks[index])
            rank = pop_rank(heap, step, mem, piece.mem, capacity, free)
            if rank < 0:
                return Assignment(choice, step, mem, ranks, infeasible=index)
            step[rank] += extra
            mem[rank] += piece.mem
            ranks[index].append(rank)
            heapq.heappush(heap, (float(step[rank]), rank))
    return Assignment(choice, step, mem, ranks, type_latency(problem, choice))


def pop_rank(
    heap: list[tuple[float, int]],
    step: np.ndarray,
    mem: np.ndarray,
    need: float,
    capacity: float,
    allowed: set[int] | None,
) -> int:
    """Pop the least-loaded rank that may hold the piece and has memory for it; -1 if none."""
    skipped, found = [], -1
    while heap:
        load, rank = heapq.heappop(heap)
        if load != step[rank]:
            continue  # stale entry
        if (allowed is None or rank in allowed) and mem[rank] + need <= capacity:
            found = rank
            break
        skipped.append((load, rank))
    for item in skipped:
        heapq.heappush(heap, item)
    return found


def type_latency(problem: Problem, choice: list[Option]) -> float:
    """Start-up cost of the collectives of every sharding type in use (cost.collective_latency)."""
    if problem.topo.world_size == 1:
        return 0.0
    sharding_types = {option.sharding_type for option in choice}
    return collectives_per_step(sharding_types, problem.topo.num_hosts) * problem.latency_per_type_s


def _remove_table(
    problem: Problem, current: Assignment, index: int, step: np.ndarray, mem: np.ndarray
) -> None:
    """Take the cost of table `index`'s current option out of `step` and `mem`."""
    old = current.choice[index]
    if old.sharding_type in PIECE_TYPES:
        piece = problem.piece(index, old.shards)
        step -= old.shards * piece.other_s
        for rank in current.ranks[index]:
            step[rank] -= piece.owner_s - piece.other_s
            mem[rank] -= piece.mem
        return
    spread_step, spread_mem = problem.spread(index, old.sharding_type)
    shift = (
        current.ranks[index][0] * problem.topo.local_world_size
        if old.sharding_type == "table_row_wise"
        else 0
    )
    step -= np.roll(spread_step, shift)
    mem -= np.roll(spread_mem, shift)


def move_table(problem: Problem, current: Assignment, index: int, option: Option) -> Assignment:
    """`current` with table `index` switched to `option`, its new pieces put on the least-loaded
    ranks (no re-balance)."""
    step, mem, ranks = current.step.copy(), current.mem.copy(), list(current.ranks)
    host_size, capacity = problem.topo.local_world_size, problem.capacity
    _remove_table(problem, current, index, step, mem)
    choice = current.choice[:index] + [option] + current.choice[index + 1 :]
    if option.sharding_type not in PIECE_TYPES:
        spread_step, spread_mem = problem.spread(index, option.sharding_type)
        ranks[index] = []
        if option.sharding_type == "table_row_wise":
            host = _least_loaded_host(problem.hosts_allowed(index), step, host_size)
            spread_step, spread_mem = (
                np.roll(spread_step, host * host_size),
                np.roll(spread_mem, host * host_size),
            )
            ranks[index] = [host]
        step += spread_step
        mem += spread_mem
        if (mem > capacity).any():
            return Assignment(choice, step, mem, ranks, 0.0, infeasible=index)
        return Assignment(choice, step, mem, ranks, type_latency(problem, choice))
    piece = problem.piece(index, option.shards)
    step += option.shards * piece.other_s
    mask = np.zeros(problem.topo.world_size, dtype=bool)
    if option.sharding_type == "table_column_wise":
        host = _least_loaded_host(problem.hosts_allowed(index), step, host_size)
        mask[host * host_size : (host + 1) * host_size] = True
    else:
        mask[problem.allowed_ranks(index)] = True
    placed = []
    for _ in range(option.shards):
        load = np.where(mask & (mem + piece.mem <= capacity), step, np.inf)
        rank = int(np.argmin(load))
        if not np.isfinite(load[rank]):
            return Assignment(choice, step, mem, ranks, 0.0, infeasible=index)
        step[rank] += piece.owner_s - piece.other_s
        mem[rank] += piece.mem
        placed.append(rank)
    ranks[index] = placed
    return Assignment(choice, step, mem, ranks, type_latency(problem, choice))


Exchange = tuple[float, int, int, "tuple[int, int] | None"]
"""(new max of the pair, table index, block index, swap partner's (table, block) or None)."""


def _best_exchange(
    problem: Problem,
    choice: list[Option],
    step: np.ndarray,
    mem: np.ndarray,
    blocks_on: dict[int, list[tuple[int, int]]],
    current_ranks: list[list[int]],
    slowest: int,
    fastest: int,
) -> Exchange | None:
    """The move of one block from the slowest to the fastest rank, or swap of two blocks between
    them, that leaves the lower maximum of the pair; None if none helps or fits."""
    capacity, host_size = problem.capacity, problem.topo.local_world_size

    def may_hold(index: int, block: int, rank: int, src: int) -> bool:
        if problem.cons[index].ranks and rank not in problem.cons[index].ranks:
            return False
        others = [r for b, r in enumerate(current_ranks[index]) if b != block]
        if others and all(r == rank for r in others):  # its blocks span two ranks at least
            return False
        return (
            choice[index].sharding_type != "table_column_wise"
            or rank // host_size == src // host_size
        )

    def piece(index: int) -> Piece:
        return problem.piece(index, choice[index].shards)

    gap = step[slowest] - step[fastest]
    best: Exchange | None = None
    for index, block in blocks_on.get(slowest, []):
        moved_s = piece(index).owner_s - piece(index).other_s
        if (
            moved_s < gap
            and may_hold(index, block, fastest, slowest)
            and mem[fastest] + piece(index).mem <= capacity
        ):
            candidate = (max(step[slowest] - moved_s, step[fastest] + moved_s), index, block, None)
            best = candidate if best is None or candidate[0] < best[0] else best
        for other, other_block in blocks_on.get(fastest, []):
            returned_s = piece(other).owner_s - piece(other).other_s
            if (
                0 < moved_s - returned_s < gap
                and may_hold(index, block, fastest, slowest)
                and may_hold(other, other_block, slowest, fastest)
                and mem[fastest] - piece(other).mem + piece(index).mem <= capacity
                and mem[slowest] - piece(index).mem + piece(other).mem <= capacity
            ):
                candidate = (
                    max(step[slowest] - moved_s + returned_s, step[fastest] + moved_s - returned_s),
                    index,
                    block,
                    (other, other_block),
                )
                best = candidate if best is None or candidate[0] < best[0] else best
    return best


def refine_ranks(problem: Problem, current: Assignment, max_moves: int) -> Assignment:
    """Move or swap single pieces between the slowest and the fastest ranks while that helps."""
    if current.infeasible >= 0:
        return current
    step, mem, ranks = (
        current.step.copy(),
        current.mem.copy(),
        [list(held) for held in current.ranks],
    )
    blocks_on: dict[int, list[tuple[int, int]]] = {}  # rank -> (table index, block index)
    for index, option in enumerate(current.choice):
        if option.sharding_type in PIECE_TYPES:
            for block, rank in enumerate(ranks[index]):
                blocks_on.setdefault(rank, []).append((index, block))
    for _ in range(max_moves):
        slowest, fastest = int(np.argmax(step)), int(np.argmin(step))
        best = _best_exchange(
            problem, current.choice, step, mem, blocks_on, ranks, slowest, fastest
        )
        if best is None or best[0] >= step[slowest] * (1 - 1e-12):
            break
        _, index, block, partner = best
        moves = [(index, block, slowest, fastest)] + (
            [(partner[0], partner[1], fastest, slowest)] if partner else []
        )
        for moved, moved_block, src, dst in moves:
            piece = problem.piece(moved, current.choice[moved].shards)
            delta = piece.owner_s - piece.other_s
            step[src] -= delta
            step[dst] += delta
            mem[src] -= piece.mem
            mem[dst] += piece.mem
            ranks[moved][moved_block] = dst
            blocks_on[src].remove((moved, moved_block))
            blocks_on.setdefault(dst, []).append((moved, moved_block))
    return Assignment(current.choice, step, mem, ranks, current.latency_s)
