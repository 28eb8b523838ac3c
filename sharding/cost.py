"""The cost model: per-rank memory, lookup time and communication time of a placement.

A step's cost on one rank is its embedding lookups (forward, then backward + fused optimizer
update at `bwd_compute_multiplier` times the forward) plus the time to send its bytes
(comms.py) over the topology's links; a plan's cost is its slowest rank's, the critical path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding.comms import KINDS, Workload, collectives_per_step, group_overhead_bytes, table_comm_bytes
from shardrec.sharding.plan_io import TablePlan
from shardrec.sharding.skew import LookupCurve, row_share
from shardrec.sharding.topology import ClusterTopology

# Optimizer state per weight row: row-wise Adagrad keeps one float per row (per column shard),
# Adam two floats per weight, SGD nothing.
OPTIMIZERS = ("rowwise_adagrad", "adam", "sgd")


def optimizer_bytes(optimizer: str, rows: int, cols: int, elem_bytes: int = 4) -> float:
    if optimizer == "rowwise_adagrad":
        return rows * 4.0
    if optimizer == "adam":
        return 2.0 * rows * cols * elem_bytes
    if optimizer == "sgd":
        return 0.0
    raise ValueError(f"optimizer {optimizer!r} is not one of {', '.join(OPTIMIZERS)}")


@dataclass
class PlanCost:
    """Per-rank figures (numpy arrays of length world_size)."""

    weights_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    buffer_bytes: np.ndarray
    lookup_s: np.ndarray
    comm_bytes: dict[str, np.ndarray]
    comm_s: np.ndarray
    memory_capacity: int

    @property
    def memory_bytes(self) -> np.ndarray:
        return self.weights_bytes + self.optimizer_bytes + self.buffer_bytes

    @property
    def step_s(self) -> np.ndarray:
        return self.lookup_s + self.comm_s

    @property
    def max_step_s(self) -> float:
        return float(self.step_s.max())

    @property
    def critical_rank(self) -> int:
        return int(np.argmax(self.step_s))

    def shortfall(self) -> dict[int, int]:
        """Ranks whose memory estimate exceeds capacity -> bytes missing."""
        over = self.memory_bytes - self.memory_capacity
        return {int(r): int(np.ceil(over[r])) for r in np.nonzero(over > 0)[0]}

    def to_dict(self) -> dict:
        ranks = []
        for r in range(len(self.step_s)):
            ranks.append({
                "rank": r,
                "memory_bytes": int(self.memory_bytes[r]),
                "weights_bytes": int(self.weights_bytes[r]),
                "optimizer_bytes": int(self.optimizer_bytes[r]),
                "buffer_bytes": int(self.buffer_bytes[r]),
                "lookup_ms": round(float(self.lookup_s[r]) * 1e3, 6),
                "comm_ms": round(float(self.comm_s[r]) * 1e3, 6),
                "step_ms": round(float(self.step_s[r]) * 1e3, 6),
                "bytes_sent": {k: int(round(float(v[r]))) for k, v in self.comm_bytes.items()},
            })
        return {
            "max_step_ms": round(self.max_step_s * 1e3, 6),
            "critical_rank": self.critical_rank,
            "memory_capacity_bytes": int(self.memory_capacity),
            "ranks": ranks,
        }


def comm_seconds(sent: dict[str, np.ndarray], topo: ClusterTopology) -> np.ndarray:
    """Seconds each rank spends sending; traffic to other ranks splits between links by how many peers sit on each."""
    W, H = topo.world_size, topo.local_world_size
    if W == 1:
        return np.zeros(1)
    intra_share = (H - 1) / (W - 1)
    mixed_bw = 1.0 / (intra_share / topo.intra_host_bw + (1 - intra_share) / topo.inter_host_bw)
    seconds = (sent["all_to_all"] + sent["all_reduce"]) / mixed_bw
    # Reduce-scatter/all-gather: row-wise spans hosts, table-row-wise stays inside one; the
    # mixed rate is a bound for both on one host and close for row-wise across hosts.
    seconds = seconds + (sent["reduce_scatter"] + sent["all_gather"]) / mixed_bw
    return seconds


@dataclass
class TableCost:
    """One table's per-rank contributions (numpy arrays of length world_size)."""

    memory_bytes: np.ndarray
    step_s: np.ndarray


def _table_arrays(t: TablePlan, cfg: EmbeddingBagConfig, L: float, topo: ClusterTopology, w: Workload, optimizer: str,
                  curve: LookupCurve | None = None):
    W = topo.world_size
    weights, optim, buffers, lookup = (np.zeros(W) for _ in range(4))
    for s in t.shards:
        weights[s.rank] += s.rows * s.cols * w.elem_bytes
        optim[s.rank] += optimizer_bytes(optimizer, s.rows, s.cols, w.elem_bytes)
        if t.sharding_type == "data_parallel":
            # Local samples only; backward writes a dense gradient of the whole table.
            lookup[s.rank] += w.local_batch * L * s.cols * w.elem_bytes
            buffers[s.rank] += s.rows * s.cols * w.elem_bytes
            continue
        share = row_share(curve, s.row_offset, s.rows, cfg.num_embeddings)
        lookup[s.rank] += w.global_batch_size * L * share * s.cols * w.elem_bytes
        buffers[s.rank] += w.global_batch_size * (L * share * w.id_bytes + 2 * s.cols * w.elem_bytes)
    sent = table_comm_bytes(t, cfg.num_embeddings, cfg.embedding_dim, L, w, topo.local_world_size, curve)
    return weights, optim, buffers, lookup, sent


def table_cost(t: TablePlan, cfg: EmbeddingBagConfig, L: float, topo: ClusterTopology, global_batch_size: int,
               optimizer: str, curve: LookupCurve | None = None) -> TableCost:
    """Memory and step time one table adds to each rank (collective start-up latency excluded)."""
    w = Workload(global_batch_size, topo.world_size)
    weights, optim, buffers, lookup, sent = _table_arrays(t, cfg, L, topo, w, optimizer, curve)
    step = lookup * (1.0 + topo.bwd_compute_multiplier) / topo.lookup_bw + comm_seconds(sent, topo)
    return TableCost(weights + optim + buffers, step)


def evaluate(
    tables: list[TablePlan],
    configs: list[EmbeddingBagConfig],
    pooling: dict[str, float],
    topo: ClusterTopology,
    global_batch_size: int,
    optimizer: str = "rowwise_adagrad",
    curves: dict[str, LookupCurve] | None = None,
) -> PlanCost:
    """Score a placement: per-rank memory, lookup and communication estimates.

    Args:
        curves: table -> lookup skew (skew.py) for frequency-ordered ids; others spread evenly.
    """
    W = topo.world_size
    w = Workload(global_batch_size, W)
    by_name = {c.name: c for c in configs}
    weights, optim, buffers, lookup = (np.zeros(W) for _ in range(4))
    sent = {k: np.zeros(W) for k in KINDS}
    for t in tables:
        parts = _table_arrays(t, by_name[t.name], pooling.get(t.name, 1.0), topo, w, optimizer, (curves or {}).get(t.name))
        for total, part in zip((weights, optim, buffers, lookup), parts[:4]):
            total += part
        for k, v in parts[4].items():
            sent[k] += v
    sent["all_to_all"] += group_overhead_bytes(tables, W)
    lookup_s = lookup * (1.0 + topo.bwd_compute_multiplier) / topo.lookup_bw
    comm_s = comm_seconds(sent, topo) + collective_latency(tables, topo)
    return PlanCost(weights, optim, buffers, lookup_s, sent, comm_s, topo.memory_bytes)


def collective_latency(tables: list[TablePlan], topo: ClusterTopology) -> float:
    """Every sharding type in use runs its own collectives (comms.COLLECTIVES_PER_GROUP)."""
    if topo.world_size == 1:
        return 0.0
    return collectives_per_step({t.sharding_type for t in tables}, topo.num_hosts) * topo.collective_latency_s
