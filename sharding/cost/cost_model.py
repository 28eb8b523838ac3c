"""The cost model: per-rank memory, lookup time and communication time of a placement.

A step's cost on one rank is its embedding lookups (forward, then backward + fused optimizer
update at `bwd_compute_multiplier` times the forward) plus the time to send its bytes
(comms.py) over the topology's links; a plan's cost is its slowest rank's, the critical path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.embeddings.sparse_optimizers import state_bytes as optimizer_bytes
from shardrec.sharding.cost.comms import (
    KINDS,
    Workload,
    collectives_per_step,
    group_overhead_bytes,
    table_comm_bytes,
)
from shardrec.sharding.cost.skew import LookupCurve, row_share
from shardrec.sharding.machine.memory import DenseFootprint, fixed_bytes
from shardrec.sharding.machine.topology import ClusterTopology
from shardrec.sharding.plan.plan_types import UNPOOLED, UVM_KERNELS, TablePlan


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
    """Bytes every rank holds whatever the placement (memory.fixed_bytes: dense layers,
    framework)."""
    device_memory: int = 0
    """The device's memory per rank, before the reserve."""
    cache_bytes: np.ndarray | float = 0.0
    """HBM of UVM tables' caches (cached rows and fbgemm's bookkeeping)."""
    host_bytes: np.ndarray | float = 0.0
    """Host memory per rank of UVM tables' weights (CUDA only)."""
    host_capacity: int = 0
    """Host memory per rank UVM tables may use."""
    id_map_bytes: float = 0.0
    """The managed tables' id maps on every rank (map_memory): part of `fixed_bytes` on CPU, host
    memory beside the device on CUDA."""

    @property
    def memory_bytes(self) -> np.ndarray:
        """On the device (HBM on CUDA; the host's memory on CPU)."""
        return (
            self.weights_bytes
            + self.optimizer_bytes
            + self.buffer_bytes
            + self.cache_bytes
            + self.fixed_bytes
        )

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

    def host_shortfall(self) -> dict[int, int]:
        """Ranks whose UVM tables exceed their host memory -> bytes missing."""
        over = np.asarray(self.host_bytes, dtype=np.float64) - self.host_capacity
        if not np.any(np.asarray(self.host_bytes) > 0):
            return {}
        over = np.broadcast_to(over, self.step_s.shape)
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
                    "id_map_bytes": int(self.id_map_bytes),
                    "cache_bytes": int(np.broadcast_to(self.cache_bytes, self.step_s.shape)[r]),
                    "host_bytes": int(np.broadcast_to(self.host_bytes, self.step_s.shape)[r]),
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
            "host_capacity_bytes": int(self.host_capacity),
            "ranks": ranks,
        }


def comm_seconds(sent: dict[str, np.ndarray], topo: ClusterTopology) -> np.ndarray:
    """Seconds each rank spends sending; traffic to other ranks splits between links by how many
    peers sit on each."""
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
    """On the device (HBM on CUDA)."""
    step_s: np.ndarray
    host_bytes: np.ndarray | None = None
    """In host memory (UVM tables' weights on CUDA)."""


@dataclass
class _TableArrays:
    """One table's per-rank figures before they are priced in seconds."""

    weights: np.ndarray
    optim: np.ndarray
    buffers: np.ndarray
    cache: np.ndarray
    """HBM of UVM caches: cached rows and fbgemm's cache bookkeeping."""
    host: np.ndarray
    lookup: np.ndarray
    """Bytes of rows read per step (forward)."""
    transfer_s: np.ndarray
    """Seconds per step moving rows between host memory and HBM (UVM tables)."""
    sent: dict[str, np.ndarray]


def _uvm_shard(
    arrays: _TableArrays,
    table_plan: TablePlan,
    index: int,
    optimizer: str,
    topo,
    lookup_bytes: float,
):
    """A fused_uvm(_caching) shard: weights in host memory, the row-wise optimizer state and the
    cache in HBM (fbgemm keeps row-wise state on the device, other state managed), lookups of
    uncached rows over the host link (torchrec prices UVM reads at a tenth of its bandwidth)."""
    shard, elem = table_plan.shards[index], 4
    rank, state = shard.rank, optimizer_bytes(optimizer, shard.rows, shard.cols, elem)
    arrays.weights[rank] -= shard.rows * shard.cols * elem
    arrays.host[rank] += shard.rows * shard.cols * elem + (
        0.0 if optimizer == "rowwise_adagrad" else state
    )
    if optimizer != "rowwise_adagrad":
        arrays.optim[rank] -= state
    cache = table_plan.cache
    if cache is None:  # fused_uvm: every lookup crosses the host link
        arrays.transfer_s[rank] += (
            lookup_bytes * (1 + topo.bwd_compute_multiplier) / (topo.host_link_bw / 10)
        )
        return
    slots = cache.rows[index]
    # fbgemm: cached rows, cache_index_table_map (4 B per row), lxu_cache_state + lru_state (16 B
    # per slot).
    arrays.cache[rank] += slots * shard.cols * elem + shard.rows * 4 + slots * 16
    # Each missed unique row is fetched, and (updated in training) written back when evicted.
    fetched = cache.fetched_rows[index] if cache.fetched_rows else 0.0
    arrays.transfer_s[rank] += 2 * fetched * shard.cols * elem / topo.host_link_bw


def _table_arrays(
    table_plan: TablePlan,
    config: EmbeddingBagConfig,
    pooling: float,
    topo: ClusterTopology,
    workload: Workload,
    optimizer: str,
    curve: LookupCurve | None = None,
) -> _TableArrays:
    """Per-rank memory, lookup bytes, transfer seconds and bytes sent of one table."""
    world_size, elem_bytes, memory = topo.world_size, workload.elem_bytes, topo.memory
    zeros = [np.zeros(world_size) for _ in range(7)]
    arrays = _TableArrays(*zeros, sent={})
    # A sequence model's table returns a row per id (unpooled), not one per sample.
    unpooled = config.pooling.name == UNPOOLED
    rows_out = pooling if unpooled else 1.0
    for index, shard in enumerate(table_plan.shards):
        table_bytes = shard.rows * shard.cols * elem_bytes
        arrays.weights[shard.rank] += table_bytes
        arrays.optim[shard.rank] += optimizer_bytes(optimizer, shard.rows, shard.cols, elem_bytes)
        if table_plan.sharding_type == "data_parallel":
            # Local samples only; backward writes a dense gradient of the whole table, which
            # DDP copies into its bucket: the weights live replicated_copies times at the peak.
            arrays.lookup[shard.rank] += workload.local_batch * pooling * shard.cols * elem_bytes
            arrays.buffers[shard.rank] += (memory.replicated_copies - 1) * table_bytes
            continue
        share = row_share(curve, shard.row_offset, shard.rows, config.num_embeddings)
        read = workload.global_batch_size * pooling * share * shard.cols * elem_bytes
        arrays.lookup[shard.rank] += read
        out_rows = (
            pooling * share if unpooled and table_plan.sharding_type == "row_wise" else rows_out
        )
        arrays.buffers[shard.rank] += (
            memory.io_copies
            * workload.global_batch_size
            * (pooling * share * workload.id_bytes + 2 * out_rows * shard.cols * elem_bytes)
        )
        if table_plan.compute_kernel in UVM_KERNELS:
            _uvm_shard(arrays, table_plan, index, optimizer, topo, read)
    arrays.sent = table_comm_bytes(
        table_plan,
        config.num_embeddings,
        config.embedding_dim,
        pooling,
        workload,
        topo.local_world_size,
        curve,
        unpooled,
    )
    return arrays


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
    a = _table_arrays(table_plan, config, pooling, topo, workload, optimizer, curve)
    step = _lookup_seconds(a, topo) + comm_seconds(a.sent, topo)
    return TableCost(a.weights + a.optim + a.buffers + a.cache, step, a.host)


def _lookup_seconds(a: _TableArrays, topo: ClusterTopology) -> np.ndarray:
    return a.lookup * (1.0 + topo.bwd_compute_multiplier) / topo.lookup_bw + a.transfer_s


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
    zeros = [np.zeros(world_size) for _ in range(7)]
    total = _TableArrays(*zeros, sent={kind: np.zeros(world_size) for kind in KINDS})
    for table_plan in table_plans:
        name = table_plan.name
        part = _table_arrays(
            table_plan,
            by_name[name],
            pooling.get(name, 1.0),
            topo,
            workload,
            optimizer,
            (curves or {}).get(name),
        )
        for key in ("weights", "optim", "buffers", "cache", "host", "lookup", "transfer_s"):
            getattr(total, key)[:] += getattr(part, key)
        for kind, volume in part.sent.items():
            total.sent[kind] += volume
    total.sent["all_to_all"] += group_overhead_bytes(table_plans, world_size)
    comm_s = comm_seconds(total.sent, topo) + collective_latency(table_plans, topo)
    return PlanCost(
        total.weights,
        total.optim,
        total.buffers,
        _lookup_seconds(total, topo),
        total.sent,
        comm_s,
        topo.usable_bytes,
        fixed_bytes=rank_fixed_bytes(topo, workload, configs, pooling, dense),
        device_memory=topo.memory_bytes,
        cache_bytes=total.cache,
        host_bytes=total.host,
        host_capacity=topo.host_memory_bytes,
        id_map_bytes=dense.id_map_bytes if dense is not None else 0,
    )


def rank_fixed_bytes(
    topo: ClusterTopology,
    workload: Workload,
    configs: list[EmbeddingBagConfig],
    pooling: dict[str, float],
    dense: DenseFootprint | None,
) -> float:
    """What every rank holds besides its tables (memory.fixed_bytes) for this job; on CPU the
    managed tables' id maps too (one memory)."""
    ids_per_sample = sum(pooling.get(config.name, 1.0) for config in configs)
    dense = dense or DenseFootprint()
    maps = dense.id_map_bytes if topo.device_kind != "cuda" else 0
    return maps + fixed_bytes(
        topo.memory,
        dense,
        workload.local_batch,
        ids_per_sample,
        workload.id_bytes,
    )


def collective_latency(table_plans: list[TablePlan], topo: ClusterTopology) -> float:
    """Every sharding type in use runs its own collectives (comms.COLLECTIVES_PER_GROUP)."""
    if topo.world_size == 1:
        return 0.0
    sharding_types = {table_plan.sharding_type for table_plan in table_plans}
    return collectives_per_step(sharding_types, topo.num_hosts) * topo.collective_latency_s
