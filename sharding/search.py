"""shardrec's search: choose a sharding type per table, then balance the pieces over ranks.

Each table's options are either *pieces* (table-wise: one; column-wise and table-column-wise:
k equal column blocks), each placed on one rank, or *spreads* (row-wise, data-parallel over
all ranks; table-row-wise over one host). Under the cost model a piece adds a large cost to
its owner and a small one (its share of the all-to-all) to every other rank, so a placement
is a longest-processing-time-first (LPT) bin packing of the pieces' owner costs on top of
the spreads, under each rank's memory. Local search then moves the critical rank's largest
tables to other options while the slowest rank gets faster. Everything is deterministic:
ties break by table order and rank, so the same inputs give the same plan.
"""

from __future__ import annotations

import heapq
import logging
from dataclasses import dataclass, replace

import numpy as np
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding import layouts
from shardrec.sharding.constraints import TableConstraint
from shardrec.sharding.cost import table_cost
from shardrec.sharding.plan_io import TablePlan
from shardrec.sharding.topology import Topology

logger = logging.getLogger(__name__)

PIECE_TYPES = ("table_wise", "column_wise", "table_column_wise")


@dataclass(frozen=True)
class Option:
    sharding_type: str
    shards: int = 1
    """Column blocks of piece types."""


@dataclass
class _Piece:
    table: int
    owner_s: float
    other_s: float
    mem: float


@dataclass
class _Assignment:
    choice: list[Option]
    step: np.ndarray
    mem: np.ndarray
    ranks: list[list[int]]
    """Per table: the rank of each column block (piece types) or the host (table_row_wise)."""
    infeasible: int = -1
    """A table that fit nowhere, or -1."""

    @property
    def score(self) -> float:
        return float("inf") if self.infeasible >= 0 else float(self.step.max())


class _Problem:
    """Tables, options and their cached per-rank costs."""

    def __init__(self, tables, topo, batch, constraints, pooling, optimizer):
        self.tables: list[EmbeddingBagConfig] = tables
        self.topo: Topology = topo
        self.batch, self.pooling, self.optimizer = batch, pooling, optimizer
        self.cons = [constraints.get(t.name, TableConstraint()) for t in tables]
        self._piece: dict[tuple[int, int], _Piece] = {}
        self._spread: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}
        self.options = [self._options(i) for i in range(len(tables))]

    def allowed_ranks(self, i: int) -> list[int]:
        return list(self.cons[i].ranks) or list(range(self.topo.world_size))

    def _options(self, i: int) -> list[Option]:
        c, cfg, topo = self.cons[i], self.tables[i], self.topo
        allowed = set(self.allowed_ranks(i))
        all_ranks = len(allowed) == topo.world_size
        hosts = self.hosts_allowed(i)
        out = []
        for st in c.sharding_types:
            if st == "table_wise":
                out.append(Option(st))
            elif st in ("column_wise", "table_column_wise"):
                limit = len(allowed) if st == "column_wise" else topo.local_world_size
                if st == "table_column_wise" and not hosts:
                    continue
                out += [Option(st, k) for k in layouts.column_splits(cfg.embedding_dim, c.min_partition, limit)]
            elif st in ("row_wise", "data_parallel") and all_ranks:
                out.append(Option(st))
            elif st == "table_row_wise" and hosts:
                out.append(Option(st))
        if not out:
            raise ValueError(
                f"sharding.constraints.{cfg.name}: no sharding type satisfies the constraint "
                f"(sharding_types {list(c.sharding_types)}, ranks {list(c.ranks) or 'all'}, "
                f"min_partition {c.min_partition}, embedding_dim {cfg.embedding_dim}, world size {topo.world_size})"
            )
        return out

    def hosts_allowed(self, i: int) -> list[int]:
        allowed, H = set(self.allowed_ranks(i)), self.topo.local_world_size
        return [h for h in range(self.topo.num_hosts) if all(h * H + j in allowed for j in range(H))]

    def piece(self, i: int, shards: int) -> _Piece:
        key = (i, shards)
        if key not in self._piece:
            cfg = self.tables[i]
            block = replace_dim(cfg, cfg.embedding_dim // shards)
            c = table_cost(layouts.table_wise(block, 0, "fused"), block, self.pooling.get(cfg.name, 1.0),
                           self.topo, self.batch, self.optimizer)
            other = float(c.step_s[1]) if self.topo.world_size > 1 else 0.0
            self._piece[key] = _Piece(i, float(c.step_s[0]), other, float(c.memory_bytes[0]))
        return self._piece[key]

    def spread(self, i: int, st: str) -> tuple[np.ndarray, np.ndarray]:
        """(step seconds, memory) per rank of a spread option (table_row_wise: on host 0)."""
        key = (i, st)
        if key not in self._spread:
            cfg, topo = self.tables[i], self.topo
            if st == "row_wise":
                t = layouts.row_wise(cfg, topo.world_size, "fused")
            elif st == "data_parallel":
                t = layouts.data_parallel(cfg, topo.world_size)
            else:
                t = layouts.table_row_wise(cfg, 0, topo.local_world_size, "fused")
            c = table_cost(t, cfg, self.pooling.get(cfg.name, 1.0), topo, self.batch, self.optimizer)
            self._spread[key] = (c.step_s, c.memory_bytes)
        return self._spread[key]

    def max_memory(self, i: int, o: Option) -> float:
        """The most memory the option needs on one rank."""
        if o.sharding_type in PIECE_TYPES:
            return self.piece(i, o.shards).mem
        return float(self.spread(i, o.sharding_type)[1].max())

    def work(self, i: int, o: Option) -> float:
        """Total seconds the option adds over all ranks (what balance cannot remove)."""
        if o.sharding_type in PIECE_TYPES:
            p = self.piece(i, o.shards)
            W = self.topo.world_size
            return o.shards * (p.owner_s + (W - 1) * p.other_s)
        return float(self.spread(i, o.sharding_type)[0].sum())


def replace_dim(cfg: EmbeddingBagConfig, dim: int) -> EmbeddingBagConfig:
    return replace(cfg, embedding_dim=dim) if dim != cfg.embedding_dim else cfg


def _place_spreads(p: _Problem, choice: list[Option], step: np.ndarray, mem: np.ndarray, ranks: list[list[int]]) -> None:
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


def _assign(p: _Problem, choice: list[Option]) -> _Assignment:
    """LPT: spreads first, then pieces from the costliest, each on the least-loaded rank with room."""
    topo, W, H, cap = p.topo, p.topo.world_size, p.topo.local_world_size, p.topo.memory_bytes
    step, mem = np.zeros(W), np.zeros(W)
    ranks: list[list[int]] = [[] for _ in choice]
    _place_spreads(p, choice, step, mem, ranks)
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
            r = _pop_rank(heap, step, mem, pc.mem, cap, allowed)
            if r < 0:
                return _Assignment(choice, step, mem, ranks, infeasible=i)
            step[r] += extra
            mem[r] += pc.mem
            ranks[i].append(r)
            heapq.heappush(heap, (float(step[r]), r))
    return _Assignment(choice, step, mem, ranks)


def _pop_rank(heap, step, mem, need: float, cap: float, allowed: set[int] | None) -> int:
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


def _initial(p: _Problem, prefer: str) -> list[Option]:
    """A starting choice: the least total work per table, or a preferred type where allowed."""
    out = []
    for i, opts in enumerate(p.options):
        preferred = [o for o in opts if o.sharding_type == prefer]
        pool = preferred or opts
        out.append(min(pool, key=lambda o: (p.work(i, o), opts.index(o))))
    return out


def _candidates(p: _Problem, a: _Assignment, limit: int) -> list[int]:
    """Tables worth moving: the infeasible one, else the biggest contributors to the critical rank."""
    if a.infeasible >= 0:
        return [a.infeasible]
    crit = int(np.argmax(a.step))
    scored = []
    for i, o in enumerate(a.choice):
        if o.sharding_type in PIECE_TYPES:
            if crit in a.ranks[i]:
                pc = p.piece(i, o.shards)
                scored.append((-(pc.owner_s - pc.other_s) * a.ranks[i].count(crit), i))
        else:
            s, _ = p.spread(i, o.sharding_type)
            scored.append((-float(s.max()), i))
    scored.sort()
    return [i for _, i in scored[:limit]]


def _improve(p: _Problem, a: _Assignment, max_rounds: int, width: int) -> _Assignment:
    for _ in range(max_rounds):
        best = a
        for i in _candidates(p, a, width):
            for o in p.options[i]:
                if o == a.choice[i]:
                    continue
                trial = _assign(p, a.choice[:i] + [o] + a.choice[i + 1:])
                if trial.score < best.score * (1 - 1e-9):
                    best = trial
            if best is not a:
                break
        if best is a:
            return a
        a = best
    return a


def _to_tables(p: _Problem, a: _Assignment, kernel: str) -> list[TablePlan]:
    out = []
    for i, (cfg, o) in enumerate(zip(p.tables, a.choice)):
        k = p.cons[i].compute_kernels[0] if p.cons[i].compute_kernels else kernel
        st = o.sharding_type
        if st == "table_wise":
            out.append(layouts.table_wise(cfg, a.ranks[i][0], k))
        elif st in ("column_wise", "table_column_wise"):
            out.append(layouts.column_wise(cfg, a.ranks[i], k, st))
        elif st == "row_wise":
            out.append(layouts.row_wise(cfg, p.topo.world_size, k))
        elif st == "table_row_wise":
            out.append(layouts.table_row_wise(cfg, a.ranks[i][0], p.topo.local_world_size, k))
        else:
            out.append(layouts.data_parallel(cfg, p.topo.world_size))
    return out


def search_plan(
    tables: list[EmbeddingBagConfig],
    topo: Topology,
    global_batch_size: int,
    constraints: dict[str, TableConstraint],
    pooling: dict[str, float],
    compute_kernel: str = "fused",
    optimizer: str = "rowwise_adagrad",
) -> list[TablePlan]:
    """The placement with the fastest critical rank among a few seeded local searches."""
    p = _Problem(tables, topo, global_batch_size, constraints, pooling, optimizer)
    # Each _assign costs O(tables log ranks); bound the rounds so 1k tables x 1k ranks stays in seconds.
    rounds = max(8, min(200, 200_000 // max(1, len(tables))))
    width = 4 if len(tables) > 200 else 8
    best = None
    for prefer in ("", "table_wise", "row_wise"):
        a = _improve(p, _assign(p, _initial(p, prefer)), rounds, width)
        logger.debug("seed %r: %.6f s", prefer or "least-work", a.score)
        if best is None or a.score < best.score:
            best = a
    if best.infeasible >= 0:
        # Nothing fits: return the placement with the least memory per rank, balanced without
        # the memory limit, so that the planner can report each rank's shortfall.
        roomy = replace(p.topo, memory_bytes=2**62)
        p.topo = roomy
        best = _assign(p, [min(opts, key=lambda o: (p.max_memory(i, o), opts.index(o))) for i, opts in enumerate(p.options)])
        p.topo = topo
    return _to_tables(p, best, compute_kernel)
