"""2D sparse parallelism (torchrec's DMPCollection): sharding groups of G ranks, W/G replicas.

Each sharding group holds a full copy of the tables, sharded over its G ranks, and trains on
its W/G share of the global batch; every `sync_every` steps the replicas all-reduce their
shards' weights and optimizer state (DMPCollection.sync). DMPCollection places a group's
ranks W/G apart, so the replicas of a shard are neighbours on one host when W/G is at most
the host size, and the group's all-to-alls cross hosts. The all-to-all volume of a group no
longer grows with W, which is why 2D exists for large worlds.

DMPCollection runs on CUDA only: on CPU a 2D plan can be made, costed and simulated, not run.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from shardrec.sharding.cost.cost_model import PlanCost
from shardrec.sharding.machine.topology import ClusterTopology


def group_topology(topo: ClusterTopology, group_size: int) -> ClusterTopology:
    """The topology one sharding group sees: G ranks, as many per host as DMPCollection's layout
    puts there."""
    W = topo.world_size
    if group_size <= 0 or W % group_size:
        raise ValueError(
            f"sharding group size {group_size} must be positive and divide world size {W}"
        )
    replicas = W // group_size
    per_host = max(1, topo.local_world_size // replicas)
    while group_size % per_host:
        per_host -= 1
    return replace(topo, world_size=group_size, local_world_size=per_host)


def group_sizes(topo: ClusterTopology) -> list[int]:
    """Sharding group sizes worth trying: powers of two from one host up to half the world."""
    W, H = topo.world_size, topo.local_world_size
    out, g = [], max(2, H)
    while g < W:
        if W % g == 0:
            out.append(g)
        g *= 2
    return out


def add_replica_sync(
    cost: PlanCost, topo: ClusterTopology, group_size: int, sync_every: int
) -> PlanCost:
    """The group's per-rank cost plus the replicas' all-reduce of weights and optimizer state
    (ring)."""
    replicas = topo.world_size // group_size
    if replicas <= 1:
        return cost
    state = cost.weights_bytes + cost.optimizer_bytes
    sync = 2.0 * (replicas - 1) / replicas * state / sync_every
    bw = topo.intra_host_bw if replicas <= topo.local_world_size else topo.inter_host_bw
    comm_bytes = dict(cost.comm_bytes)
    comm_bytes["all_reduce"] = cost.comm_bytes["all_reduce"] + sync
    comm_s = cost.comm_s + sync / bw + (topo.collective_latency_s / sync_every)
    return replace(cost, comm_bytes=comm_bytes, comm_s=np.asarray(comm_s))
