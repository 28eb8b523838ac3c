"""How communication per step grows with the number of ranks, for three placements.

With the batch per rank fixed (weak scaling), each rank's bytes per step are computed in
closed form (comms.py) for:

- row-wise: every table split over all ranks. Each rank reduce-scatters a partial sum for
  the whole global batch and sends a length per sample to every rank, so its bytes grow
  linearly with the number of ranks.
- table-wise: every table whole on one rank (balanced by bytes). The owner of a table sends
  every other rank its pooled rows, so the busiest rank's bytes also grow with the ranks.
- 2D (torchrec's DMPCollection): ranks form sharding groups of G; each group row-wise shards
  a full copy of the tables for its share of the batch, and the replicas all-reduce their
  shards' weights every `sync_every` steps (charged per step, amortised). Bytes per rank
  stop growing once the world exceeds G.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
from rich.table import Table
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding.cost.comms import SPLITS_BYTES, Workload, table_comm_bytes
from shardrec.sharding.cost.layouts import table_wise

GROUP_SIZES = (8, 16, 32, 64, 128)


@dataclass(frozen=True)
class SimRow:
    world_size: int
    row_wise_bytes: float
    """Bytes per rank per step, all tables row-wise (all ranks alike)."""
    table_wise_max_bytes: float
    """Bytes per step of the busiest rank, all tables table-wise."""
    twod_bytes: float
    """Bytes per rank per step of 2D: row-wise within groups of `group_size` plus the replica
    all-reduce."""
    group_size: int
    twod_sync_bytes: float
    """Of which the replica all-reduce of the weights."""


def row_wise_bytes(
    configs: list[EmbeddingBagConfig], pooling: dict[str, float], w: Workload
) -> float:
    """Closed form of comms.table_comm_bytes for row-wise tables with equal blocks, per rank."""
    W, b = w.world_size, w.local_batch
    total = SPLITS_BYTES * (W - 1) if W > 1 else 0.0
    for config in configs:
        L = pooling.get(config.name, 1.0)
        total += (W - 1) * b * w.length_bytes + b * L * w.id_bytes * (W - 1) / W
        total += 2 * (W - 1) * b * config.embedding_dim * w.elem_bytes
    return total


def table_wise_max_bytes(
    configs: list[EmbeddingBagConfig], pooling: dict[str, float], w: Workload
) -> float:
    """Busiest rank when tables are placed whole, heaviest sender first on the least-loaded rank."""
    W = w.world_size
    sent = np.zeros(W)
    order = sorted(configs, key=lambda t: (-t.embedding_dim, t.name))
    heap = [(0.0, r) for r in range(W)]
    for t in order:
        load, r = heapq.heappop(heap)
        sent += table_comm_bytes(
            table_wise(t, r, "fused"),
            t.num_embeddings,
            t.embedding_dim,
            pooling.get(t.name, 1.0),
            w,
            W,
        )["all_to_all"]
        heapq.heappush(heap, (float(sent[r]), r))
    return float(sent.max()) + (SPLITS_BYTES * (W - 1) if W > 1 else 0.0)


def twod_bytes(
    configs: list[EmbeddingBagConfig],
    pooling: dict[str, float],
    per_rank_batch: int,
    world_size: int,
    group_size: int,
    sync_every: int = 1,
    elem_bytes: int = 4,
) -> tuple[float, float]:
    """(total, replica sync) bytes per rank per step for 2D with sharding groups of group_size."""
    G = min(group_size, world_size)
    R = world_size // G
    inside = row_wise_bytes(configs, pooling, Workload(per_rank_batch * G, G))
    shard_bytes = sum(-(-t.num_embeddings // G) * t.embedding_dim * elem_bytes for t in configs)
    sync = 2.0 * (R - 1) / R * shard_bytes / sync_every if R > 1 else 0.0
    return inside + sync, sync


def simulate(
    configs: list[EmbeddingBagConfig],
    pooling: dict[str, float],
    per_rank_batch: int,
    world_sizes: list[int],
    group_sizes: tuple[int, ...] = GROUP_SIZES,
    sync_every: int = 1,
) -> list[SimRow]:
    """Bytes per step for each world size; 2D takes the group size (of group_sizes) that sends
    least."""
    rows = []
    for W in world_sizes:
        w = Workload(per_rank_batch * W, W)
        candidates = [g for g in group_sizes if g <= W] or [W]
        best = min(
            (
                twod_bytes(configs, pooling, per_rank_batch, W, g, sync_every) + (g,)
                for g in candidates
            ),
            key=lambda x: (x[0], x[2]),
        )
        rows.append(
            SimRow(
                W,
                row_wise_bytes(configs, pooling, w),
                table_wise_max_bytes(configs, pooling, w),
                best[0],
                best[2],
                best[1],
            )
        )
    return rows


def _mib(n: float) -> str:
    """Bytes as MiB with separators and one number of decimals for the column: 13,724.95."""
    return f"{n / 2**20:,.2f}"


def simulation_table(rows: list[SimRow], tables: int, per_rank: int) -> Table:
    """`shardrec plan --simulate`'s table: MiB each rank sends per step, by ranks and placement."""
    t = Table(
        title=f"MiB sent per rank per step, {tables} tables, {per_rank:,} samples per rank (weak scaling)"
    )
    for col in (
        "ranks",
        "row-wise MiB",
        "table-wise busiest MiB",
        "2D MiB",
        "2D group",
        "2D of which sync MiB",
    ):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            f"{r.world_size:,}",
            _mib(r.row_wise_bytes),
            _mib(r.table_wise_max_bytes),
            _mib(r.twod_bytes),
            f"{r.group_size:,}",
            _mib(r.twod_sync_bytes),
        )
    return t
