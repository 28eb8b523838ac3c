"""Score any placement with torchrec's own estimators (EmbeddingPerfEstimator via its enumerator).

torchrec rates a plan by its slowest rank: the sum over the rank's shards of each shard's
estimated forward + backward compute and communication time. To rate a placement torchrec did
not make, every table's sharding option is enumerated by torchrec (column-wise blocks sized by
setting min_partition to our block width) and each shard is charged to the rank our plan gives it.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding.machine.topology import ClusterTopology
from shardrec.sharding.plan.constraints import TableConstraint
from shardrec.sharding.plan.plan_types import SHARDING_TYPES, TablePlan
from shardrec.sharding.torchrec.sharders import build_sharders
from shardrec.sharding.torchrec.torchrec_planner import (
    planning_ebc,
    quiet_torchrec,
    to_parameter_constraints,
    to_torchrec_topology,
)

logger = logging.getLogger(__name__)


def _shape_key(shards) -> tuple:
    return tuple(sorted((tuple(s[0]), tuple(s[1])) for s in shards))


def torchrec_score(
    table_plans: list[TablePlan],
    configs: list[EmbeddingBagConfig],
    topo: ClusterTopology,
    global_batch_size: int,
    pooling: dict[str, float],
    optimizer: str = "rowwise_adagrad",
) -> float | None:
    """torchrec's estimate of the slowest rank's step time (seconds), or None if a table's layout
    has no torchrec option."""
    by_plan = {table_plan.name: table_plan for table_plan in table_plans}
    cons = {}
    for config in configs:
        tp = by_plan[config.name]
        width = (
            min(s.cols for s in tp.shards)
            if tp.sharding_type in ("column_wise", "table_column_wise")
            else 0
        )
        cons[config.name] = TableConstraint(sharding_types=(tp.sharding_type,), min_partition=width)
    params = to_parameter_constraints(configs, cons, pooling, "fused")
    for name, tp in by_plan.items():
        params[name].compute_kernels = [tp.compute_kernel]
    with warnings.catch_warnings(), quiet_torchrec():
        warnings.simplefilter("ignore")
        enumerator = EmbeddingEnumerator(
            topology=to_torchrec_topology(topo),
            batch_size=max(1, global_batch_size // topo.world_size),
            constraints=params,
        )
        options = enumerator.enumerate(planning_ebc(configs, optimizer), build_sharders())
    found: dict[tuple, object] = {}
    for o in options:
        key = (
            o.name,
            o.sharding_type,
            o.compute_kernel,
            _shape_key((s.size, s.offset) for s in o.shards),
        )
        found[key] = o
    per_rank = np.zeros(topo.world_size)
    for tp in table_plans:
        shapes = [((s.rows, s.cols), (s.row_offset, s.col_offset)) for s in tp.shards]
        o = found.get((tp.name, tp.sharding_type, tp.compute_kernel, _shape_key(shapes)))
        if o is None:
            logger.info(
                "torchrec has no option for %s laid out %s; no torchrec score",
                tp.name,
                tp.sharding_type,
            )
            return None
        perf = {(tuple(s.size), tuple(s.offset)): s.perf.total for s in o.shards}
        if tp.sharding_type == "data_parallel":
            for s, ts in zip(tp.shards, o.shards):
                per_rank[s.rank] += ts.perf.total
            continue
        for s in tp.shards:
            per_rank[s.rank] += perf[((s.rows, s.cols), (s.row_offset, s.col_offset))]
    return float(per_rank.max()) / 1e3  # torchrec's estimates are in milliseconds


__all__ = ["torchrec_score", "SHARDING_TYPES"]
