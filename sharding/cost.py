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
from shardrec.sharding.memory import DenseFootprint, fixed_bytes
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
    """Tables' per-step inputs and outputs, and data-parallel tables' gradients and DDP buckets."""
    lookup_s: np.ndarray
    comm_bytes: dict[str, np.ndarray]
    comm_s: np.ndarray
    memory_capacity: int
    """Bytes per rank the plan may fill (the device's memory less the reserve)."""
    fixed_bytes: float = 0.0
    """Bytes every rank holds whatever the placement (memory.fixed_bytes: dense layers, framework)."""
    device_memory: int = 0
    """The device's memory per rank, before the reserve."""

    @property
    def memory_bytes(self) -> np.ndarray:
        return self.weights_bytes + self.optimizer_bytes + self.buffer_bytes + self.fixed_bytes

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
            ranks.append(
                {
                    "rank": r,
                    "memory_bytes": int(self.memory_bytes[r]),
                    "weights_bytes": int(self.weights_bytes[r]),
                    "optimizer_bytes": int(self.optimizer_bytes[r]),
                    "buffer_bytes": int(self.buffer_bytes[r]),
                    "fixed_bytes": int(self.fixed_bytes),
                    "lookup_ms": round(float(self.lookup_s[r]) * 1e3, 6),
                    "comm_ms": round(float(self.comm_s[r]) * 1e3, 6),
                    "step_ms": round(float(self.step_s[r]) * 1e3, 6),
                    "bytes_sent": {k: int(round(float(v[r]))) for k, v in self.comm_bytes.items()},
                }
            )
        return {
            "max_step_ms": round(self.max_step_s * 1e3, 6),
            "critical_rank": self.critical_rank,
            "memory_capacity_bytes": int(self.memory_capacity),
            "device_memory_bytes": int(self.device_memory),
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


def _table_arrays(
    table_plan: TablePlan,
    config: EmbeddingBagConfig,
    pooling: float,
    topo: ClusterTopology,
    workload: Workload,
    optimizer: str,
    curve: LookupCurve | None = None,
):
    """Per-rank (weights, optimizer, buffer bytes, lookup bytes) and bytes sent of one table."""
    world_size, elem_bytes, memory = topo.world_size, workload.elem_bytes, topo.memory
    weights, optim, buffers, lookup = (np.zeros(world_size) for _ in range(4))
    for shard in table_plan.shards:
        table_bytes = shard.rows * shard.cols * elem_bytes
        weights[shard.rank] += table_bytes
        optim[shard.rank] += optimizer_bytes(optimizer, shard.rows, shard.cols, elem_bytes)
        if table_plan.sharding_type == "data_parallel":
            # Local samples only; backward writes a dense gradient of the whole table, which
            # DDP copies into its bucket: the weights live replicated_copies times at the peak.
            lookup[shard.rank] += workload.local_batch * pooling * shard.cols * elem_bytes
            buffers[shard.rank] += (memory.replicated_copies - 1) * table_bytes
            continue
        share = row_share(curve, shard.row_offset, shard.rows, config.num_embeddings)
        lookup[shard.rank] += workload.global_batch_size * pooling * share * shard.cols * elem_bytes
        buffers[shard.rank] += (
            memory.io_copies
            * workload.global_batch_size
            * (pooling * share * workload.id_bytes + 2 * shard.cols * elem_bytes)
        )
    sent = table_comm_bytes(
        table_plan, config.num_embeddings, config.embedding_dim, pooling, workload, topo.local_world_size, curve
    )
    return weights, optim, buffers, lookup, sent


def table_cost(
    table_plan: TablePlan,
    config: EmbeddingBagConfig,
    pooling: float,
    topo: ClusterTopology,
    global_batch_size: int,
    optimizer: str,
    curve: LookupCurve | None = None,
) -> TableCost:
    """Memory and step time one table adds to each rank (collective start-up latency excluded)."""
    workload = Workload(global_batch_size, topo.world_size)
    weights, optim, buffers, lookup, sent = _table_arrays(table_plan, config, pooling, topo, workload, optimizer, curve)
    step = lookup * (1.0 + topo.bwd_compute_multiplier) / topo.lookup_bw + comm_seconds(sent, topo)
    return TableCost(weights + optim + buffers, step)


def evaluate(
    table_plans: list[TablePlan],
    configs: list[EmbeddingBagConfig],
    pooling: dict[str, float],
    topo: ClusterTopology,
    global_batch_size: int,
    optimizer: str = "rowwise_adagrad",
    curves: dict[str, LookupCurve] | None = None,
    dense: DenseFootprint | None = None,
) -> PlanCost:
    """Score a placement: per-rank memory, lookup and communication estimates.

    Args:
        table_plans: where each table lives; configs: the tables themselves (looked up by name).
        curves: table -> lookup skew (skew.py) for frequency-ordered ids; others spread evenly.
        dense: the dense layers (memory.py); None: no dense layers in the estimate.
    """
    world_size = topo.world_size
    workload = Workload(global_batch_size, world_size)
    by_name = {config.name: config for config in configs}
    weights, optim, buffers, lookup = (np.zeros(world_size) for _ in range(4))
    sent = {kind: np.zeros(world_size) for kind in KINDS}
    for table_plan in table_plans:
        name = table_plan.name
        parts = _table_arrays(
            table_plan, by_name[name], pooling.get(name, 1.0), topo, workload, optimizer, (curves or {}).get(name)
        )
        for total, part in zip((weights, optim, buffers, lookup), parts[:4]):
            total += part
        for kind, volume in parts[4].items():
            sent[kind] += volume
    sent["all_to_all"] += group_overhead_bytes(table_plans, world_size)
    lookup_s = lookup * (1.0 + topo.bwd_compute_multiplier) / topo.lookup_bw
    comm_s = comm_seconds(sent, topo) + collective_latency(table_plans, topo)
    fixed = rank_fixed_bytes(topo, workload, configs, pooling, dense)
    return PlanCost(
        weights,
        optim,
        buffers,
        lookup_s,
        sent,
        comm_s,
        topo.usable_bytes,
        fixed_bytes=fixed,
        device_memory=topo.memory_bytes,
    )


def rank_fixed_bytes(
    topo: ClusterTopology,
    workload: Workload,
    configs: list[EmbeddingBagConfig],
    pooling: dict[str, float],
    dense: DenseFootprint | None,
) -> float:
    """What every rank holds besides its tables (memory.fixed_bytes) for this job."""
    ids_per_sample = sum(pooling.get(config.name, 1.0) for config in configs)
    return fixed_bytes(topo.memory, dense or DenseFootprint(), workload.local_batch, ids_per_sample, workload.id_bytes)


def collective_latency(table_plans: list[TablePlan], topo: ClusterTopology) -> float:
    """Every sharding type in use runs its own collectives (comms.COLLECTIVES_PER_GROUP)."""
    if topo.world_size == 1:
        return 0.0
    sharding_types = {table_plan.sharding_type for table_plan in table_plans}
    return collectives_per_step(sharding_types, topo.num_hosts) * topo.collective_latency_s
