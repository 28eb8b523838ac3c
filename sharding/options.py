"""A planning problem: each table's sharding options and what each costs per rank.

Options are either *pieces* (table-wise: one; column-wise and table-column-wise: k equal
column blocks), each placed on one rank, or *spreads* (row-wise and data-parallel over all
ranks; table-row-wise over one host). Under the cost model a piece adds a large cost to its
owner and a small one (its share of the all-to-all) to every other rank.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding import layouts
from shardrec.sharding.constraints import TableConstraint
from shardrec.sharding.cost import table_cost
from shardrec.sharding.topology import ClusterTopology

PIECE_TYPES = ("table_wise", "column_wise", "table_column_wise")


@dataclass(frozen=True)
class Option:
    sharding_type: str
    shards: int = 1
    """Column blocks of piece types."""


@dataclass
class Piece:
    table: int
    owner_s: float
    other_s: float
    mem: float


class Problem:
    """Tables, options and their cached per-rank costs."""

    def __init__(self, tables, topo, batch, constraints, pooling, optimizer, curves=None):
        self.tables: list[EmbeddingBagConfig] = tables
        self.curves = curves or {}
        """table -> lookup skew (skew.py) for frequency-ordered ids."""
        self.topo: ClusterTopology = topo
        self.batch, self.pooling, self.optimizer = batch, pooling, optimizer
        self.cons = [constraints.get(t.name, TableConstraint()) for t in tables]
        self._piece: dict[tuple[int, int], Piece] = {}
        self._spread: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}
        self.options = [self._options(i) for i in range(len(tables))]
        self.latency_per_type_s = topo.collective_latency_s
        """Start-up cost of one collective (comms.collectives_per_step counts them per type group)."""

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

    def piece(self, i: int, shards: int) -> Piece:
        key = (i, shards)
        if key not in self._piece:
            cfg = self.tables[i]
            block = replace_dim(cfg, cfg.embedding_dim // shards)
            c = table_cost(layouts.table_wise(block, 0, "fused"), block, self.pooling.get(cfg.name, 1.0),
                           self.topo, self.batch, self.optimizer)
            other = float(c.step_s[1]) if self.topo.world_size > 1 else 0.0
            self._piece[key] = Piece(i, float(c.step_s[0]), other, float(c.memory_bytes[0]))
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
            c = table_cost(t, cfg, self.pooling.get(cfg.name, 1.0), topo, self.batch, self.optimizer,
                           self.curves.get(cfg.name))
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
