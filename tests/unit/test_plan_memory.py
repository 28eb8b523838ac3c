"""The planner's per-rank memory, worked by hand: the weights and the sparse optimizer's state
each rank holds under a placement (sharding.cost.evaluate), as test_comm_model works bytes sent."""

from __future__ import annotations

import pytest
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding.cost import layouts
from shardrec.sharding.cost.cost_model import evaluate
from shardrec.sharding.machine.topology import build_topology

T0 = EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=24, feature_names=["f0"])
T1 = EmbeddingBagConfig(name="t1", embedding_dim=16, num_embeddings=12, feature_names=["f1"])


def _cost(optimizer: str):
    # t0 whole on rank 1; t1 row-wise: rows 0-5 on rank 0, rows 6-11 on rank 1.
    placed = [layouts.table_wise(T0, 1, "fused"), layouts.row_wise(T1, 2, "fused")]
    return evaluate(
        placed, [T0, T1], {"t0": 1.0, "t1": 1.0}, build_topology("cpu-gloo", 2), 8, optimizer
    )


@pytest.mark.parametrize(
    "optimizer, state",
    [
        # One fp32 accumulator per row of each shard: rank 0 holds 6 rows of t1, rank 1 24 of t0 and
        # 6 of t1.
        ("rowwise_adagrad", [6 * 4, (24 + 6) * 4]),
        # Two fp32 moments per weight.
        ("adam", [2 * 6 * 16 * 4, 2 * (24 * 8 + 6 * 16) * 4]),
        # Full Adagrad (MLPerf DLRMv2's): one fp32 sum per weight, as much as the weights again.
        ("adagrad", [6 * 16 * 4, (24 * 8 + 6 * 16) * 4]),
        ("sgd", [0, 0]),
    ],
)
def test_per_rank_weights_and_optimizer_state(optimizer: str, state: list[int]) -> None:
    cost = _cost(optimizer)
    assert list(cost.weights_bytes) == [6 * 16 * 4, (24 * 8 + 6 * 16) * 4]
    assert list(cost.optimizer_bytes) == state
    assert list(cost.memory_bytes) == list(
        cost.weights_bytes + cost.optimizer_bytes + cost.buffer_bytes + cost.fixed_bytes
    )
