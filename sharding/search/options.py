"""A planning problem: each table's sharding options and what each costs per rank.

Options are either *pieces* (table-wise: one; column-wise and table-column-wise: k equal
column blocks), each placed on one rank, or *spreads* (row-wise and data-parallel over all
ranks; table-row-wise over one host). Under the cost model a piece adds a large cost to its
owner and a small one (its share of the all-to-all) to every other rank. Tables are referred
to by their index in `Problem.configs`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding.cost import layouts
from shardrec.sharding.cost.comms import Workload
from shardrec.sharding.cost.cost_model import rank_fixed_bytes, table_cost
from shardrec.sharding.cost.skew import LookupCurve
from shardrec.sharding.machine.topology import ClusterTopology
from shardrec.sharding.plan.constraints import TableConstraint, sharding_options, unsatisfiable
from shardrec.sharding.search.cached_tables import with_kernel
from shardrec.sharding.search.request import SearchRequest

PIECE_TYPES = ("table_wise", "column_wise", "table_column_wise")


@dataclass(frozen=True)
class Option:
    sharding_type: str
    shards: int = 1
    """Column blocks of piece types."""


@dataclass
class Piece:
    table: int
    """Index of the table in Problem.configs."""
    owner_s: float
    other_s: float
    mem: float


class Problem:
    """Tables, options and their cached per-rank costs."""

    def __init__(self, request: SearchRequest) -> None:
        self.configs: list[EmbeddingBagConfig] = request.configs
        self.curves: dict[str, LookupCurve] = request.curves or {}
        """table -> lookup skew (skew.py) for frequency-ordered ids."""
        self.topo: ClusterTopology = request.topology
        self.batch, self.pooling, self.optimizer = (
            request.global_batch_size,
            request.pooling,
            request.optimizer,
        )
        self.cons = [
            request.constraints.get(config.name, TableConstraint()) for config in self.configs
        ]
        self.kernels, self.frequencies = request.kernels, request.frequencies
        self.ids_by_frequency = request.ids_by_frequency
        self._piece: dict[tuple[int, int], Piece] = {}
        self._spread: dict[tuple[int, str], tuple[np.ndarray, np.ndarray]] = {}
        self.options = [self._options(index) for index in range(len(self.configs))]
        self.latency_per_type_s = self.topo.collective_latency_s
        """Start-up cost of one collective (comms.collectives_per_step counts them per type
        group)."""
        workload = Workload(self.batch, self.topo.world_size)
        self.capacity: float = self.topo.usable_bytes - rank_fixed_bytes(
            self.topo, workload, self.configs, self.pooling, request.dense
        )
        """Bytes per rank the tables may fill: the usable memory less what every rank holds
        anyway."""

    def allowed_ranks(self, index: int) -> list[int]:
        return list(self.cons[index].ranks) or list(range(self.topo.world_size))

    def _options(self, index: int) -> list[Option]:
        constraint, config, topo = self.cons[index], self.configs[index], self.topo
        allowed = sharding_options(
            constraint, config.embedding_dim, topo.world_size, topo.local_world_size
        )
        if not allowed:
            raise ValueError(
                unsatisfiable(config.name, constraint, config.embedding_dim, topo.world_size)
            )
        return [Option(t, k) for t, k in allowed]

    def hosts_allowed(self, index: int) -> list[int]:
        """Hosts all of whose ranks the table may use."""
        allowed, host_size = set(self.allowed_ranks(index)), self.topo.local_world_size
        return [
            host
            for host in range(self.topo.num_hosts)
            if all(host * host_size + local in allowed for local in range(host_size))
        ]

    def piece(self, index: int, shards: int) -> Piece:
        key = (index, shards)
        if key not in self._piece:
            config = self.configs[index]
            block = replace_dim(config, config.embedding_dim // shards)
            cost = table_cost(
                self.with_kernel(index, layouts.table_wise(block, 0, "fused")),
                block,
                self.pooling.get(config.name, 1.0),
                self.topo,
                self.batch,
                self.optimizer,
            )
            other = float(cost.step_s[1]) if self.topo.world_size > 1 else 0.0
            self._piece[key] = Piece(
                index, float(cost.step_s[0]), other, float(cost.memory_bytes[0])
            )
        return self._piece[key]

    def spread(self, index: int, sharding_type: str) -> tuple[np.ndarray, np.ndarray]:
        """(step seconds, memory) per rank of a spread option (table_row_wise: on host 0)."""
        key = (index, sharding_type)
        if key not in self._spread:
            config, topo = self.configs[index], self.topo
            if sharding_type == "row_wise":
                layout = layouts.row_wise(config, topo.world_size, "fused")
            elif sharding_type == "data_parallel":
                layout = layouts.data_parallel(config, topo.world_size)
            else:
                layout = layouts.table_row_wise(config, 0, topo.local_world_size, "fused")
            cost = table_cost(
                self.with_kernel(index, layout),
                config,
                self.pooling.get(config.name, 1.0),
                topo,
                self.batch,
                self.optimizer,
                self.curves.get(config.name),
            )
            self._spread[key] = (cost.step_s, cost.memory_bytes)
        return self._spread[key]

    def with_kernel(self, index: int, table_plan):
        """The layout on the table's kernel past device memory, if it has one (cached_tables.py)."""
        name = self.configs[index].name
        return with_kernel(
            table_plan, self.kernels.get(name), self.frequencies.get(name), self.ids_by_frequency
        )

    def max_memory(self, index: int, option: Option) -> float:
        """The most memory the option needs on one rank."""
        if option.sharding_type in PIECE_TYPES:
            return self.piece(index, option.shards).mem
        return float(self.spread(index, option.sharding_type)[1].max())

    def work(self, index: int, option: Option) -> float:
        """Total seconds the option adds over all ranks (what balance cannot remove)."""
        if option.sharding_type in PIECE_TYPES:
            piece = self.piece(index, option.shards)
            world_size = self.topo.world_size
            return option.shards * (piece.owner_s + (world_size - 1) * piece.other_s)
        return float(self.spread(index, option.sharding_type)[0].sum())


def replace_dim(config: EmbeddingBagConfig, dim: int) -> EmbeddingBagConfig:
    return replace(config, embedding_dim=dim) if dim != config.embedding_dim else config
