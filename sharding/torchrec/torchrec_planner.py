"""torchrec's default planner (EmbeddingShardingPlanner) run under shardrec's sharders.

It is the baseline `shardrec bench plan` compares against, and a fallback search.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager

import torch.nn as nn
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.planner.storage_reservations import (
    HeuristicalStorageReservation,
    StorageReservation,
)
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.embeddings.optim import attach_fused_optimizer
from shardrec.embeddings.tables import build_ebc, build_ec, is_unpooled
from shardrec.sharding.machine.topology import ClusterTopology
from shardrec.sharding.plan.constraints import TableConstraint
from shardrec.sharding.plan.plan_types import TablePlan
from shardrec.sharding.search.request import SearchRequest
from shardrec.sharding.torchrec.sharders import build_sharders
from shardrec.sharding.torchrec.torchrec_plans import from_sharding_plan

logger = logging.getLogger(__name__)


def to_torchrec_topology(topo: ClusterTopology) -> Topology:
    # Same hardware figures as shardrec's cost model (torchrec counts bandwidth in bytes/ms).
    # torchrec's storage reservations take their share of HBM only: on CUDA the planner's
    # reservation keeps topo.reserve_fraction free, on CPU the reserve is taken here.
    if topo.device_kind == "cuda":
        cap = {"hbm_cap": topo.memory_bytes, "hbm_mem_bw": topo.lookup_bw / 1e3}
    else:
        cap = {"ddr_cap": topo.usable_bytes, "ddr_mem_bw": topo.lookup_bw / 1e3}
    # torchrec warns that it prefers its TopologyFactory; the direct constructor is public and
    # exact.
    with quiet_torchrec(logging.ERROR):
        return Topology(
            world_size=topo.world_size,
            compute_device=topo.device_kind,
            local_world_size=topo.local_world_size,
            intra_host_bw=topo.intra_host_bw / 1e3,
            inter_host_bw=topo.inter_host_bw / 1e3,
            bwd_compute_multiplier=topo.bwd_compute_multiplier,
            **cap,
        )


def planning_ebc(configs: list[EmbeddingBagConfig], optimizer: str):
    """The tables on the meta device, marked with the sparse optimizer: torchrec's storage estimator
    reads the optimizer from the weights' marks and prices no optimizer state for an unmarked
    weight (the class of bug torchrec PR #2652 fixed), so its plans would not count it."""
    ebc = build_ebc(configs)
    attach_fused_optimizer(
        ebc, [config.name for config in configs], optimizer=optimizer, lr=0.01, eps=1e-8
    )
    return ebc


def planning_module(configs: list[EmbeddingBagConfig], optimizer: str) -> nn.Module:
    """planning_ebc's module for torchrec's planner; with a sequence model's unpooled tables, a
    module holding both collections (`ebc`, `ec`), each marked with the optimizer."""
    unpooled = [c for c in configs if is_unpooled(c)]
    if not unpooled:
        return planning_ebc(configs, optimizer)
    module = nn.Module()
    pooled = [c for c in configs if not is_unpooled(c)]
    if pooled:
        module.ebc = planning_ebc(pooled, optimizer)
    module.ec = build_ec(unpooled)
    attach_fused_optimizer(
        module.ec, [c.name for c in unpooled], optimizer=optimizer, lr=0.01, eps=1e-8
    )
    return module


def to_parameter_constraints(
    configs: list[EmbeddingBagConfig],
    constraints: dict[str, TableConstraint],
    pooling: dict[str, float],
    compute_kernel: str,
) -> dict[str, ParameterConstraints]:
    """torchrec constraints for every table (ranks constraints have no torchrec equivalent and are
    dropped)."""
    out = {}
    for config in configs:
        constraint = constraints.get(config.name, TableConstraint())
        kw = {}
        if constraint.min_partition:
            kw["min_partition"] = constraint.min_partition
        out[config.name] = ParameterConstraints(
            sharding_types=list(constraint.sharding_types),
            compute_kernels=list(constraint.compute_kernels) or [compute_kernel, "dense"],
            pooling_factors=[pooling.get(config.name, 1.0) / len(config.feature_names)]
            * len(config.feature_names),
            **kw,
        )
    return out


def torchrec_plan(
    request: SearchRequest, storage_reservation: StorageReservation | None = None
) -> list[TablePlan]:
    """Placement chosen by torchrec's EmbeddingShardingPlanner (its default proposers and
    partitioner).

    The request's skew curves are not used: torchrec's estimators do not model them.
    `storage_reservation` None keeps torchrec's default (HeuristicalStorageReservation) with
    the topology's reserve fraction.
    """
    world_size = request.topology.world_size
    with warnings.catch_warnings(), quiet_torchrec(logging.ERROR):
        warnings.simplefilter("ignore", FutureWarning)
        constraints = to_parameter_constraints(
            request.configs, request.constraints, request.pooling, request.compute_kernel
        )
        planner = EmbeddingShardingPlanner(
            topology=to_torchrec_topology(request.topology),
            batch_size=max(1, request.global_batch_size // world_size),
            constraints=constraints,
            storage_reservation=storage_reservation
            or HeuristicalStorageReservation(percentage=request.topology.reserve_fraction),
            debug=False,
        )
        plan = planner.plan(planning_module(request.configs, request.optimizer), build_sharders())
    merged = {name: ps for module in plan.plan.values() for name, ps in module.items()}
    return from_sharding_plan(merged, request.configs, world_size)


@contextmanager
def quiet_torchrec(level: int = logging.WARNING):
    """torchrec's planner logs every proposal at INFO (and warns on the root logger for every
    data-parallel table); while it runs, keep only its records at `level` and above."""

    def keep(record: logging.LogRecord) -> bool:
        if str(record.msg).startswith("Sharding spec not found"):
            return False
        return not record.name.startswith("torchrec") or record.levelno >= level

    drop = logging.Filter()
    drop.filter = keep  # type: ignore[method-assign]
    handlers = list(logging.getLogger().handlers)
    for h in handlers:
        h.addFilter(drop)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(drop)
