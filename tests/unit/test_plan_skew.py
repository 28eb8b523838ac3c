"""Id skew from the manifest's statistics: frequency-ordered ids load row-wise's first block."""

from __future__ import annotations

import pytest
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding.cost import layouts
from shardrec.sharding.cost.cost_model import evaluate
from shardrec.sharding.cost.skew import LookupCurve, curves_from_stats
from shardrec.sharding.machine.topology import build_topology
from shardrec.sharding.planner import plan_tables
from shardrec.sharding.search.request import DatasetStatistics, PlanRequest

HOT = {"mean_ids_per_sample": 20.0, "top1_share": 0.6, "top10_share": 0.9}


def _tables():
    return [
        EmbeddingBagConfig(
            name=f"t_f{i}", embedding_dim=64, num_embeddings=400_000, feature_names=[f"f{i}"]
        )
        for i in range(4)
    ]


def test_curve_shares() -> None:
    c = LookupCurve(0.6, 0.9)
    assert c.share(0.0, 0.01) == pytest.approx(0.6)
    assert c.share(0.0, 0.25) + c.share(0.25, 1.0) == pytest.approx(1.0)
    assert c.share(0.0, 0.25) > 0.9
    assert curves_from_stats(_tables(), {"f0": HOT}, ids_by_frequency=False) == {}
    with pytest.raises(ValueError, match="must lie in"):
        curves_from_stats(_tables(), {"f0": {"top1_share": 2, "top10_share": 1}}, True)


def test_frequency_ordered_ids_skew_row_wise() -> None:
    tables = _tables()
    topo = build_topology("h100", 4)
    curves = curves_from_stats(tables, {t.feature_names[0]: HOT for t in tables}, True)
    placed = [layouts.row_wise(t, 4, "fused") for t in tables]
    pooling = {t.name: 20.0 for t in tables}
    even = evaluate(placed, tables, pooling, topo, 8192)
    skewed = evaluate(placed, tables, pooling, topo, 8192, curves=curves)
    assert skewed.lookup_s[0] > 3 * skewed.lookup_s[1]
    assert skewed.max_step_s > even.max_step_s
    assert even.lookup_s[0] == pytest.approx(even.lookup_s[1])


def test_planner_prices_skew_into_row_wise() -> None:
    tables = _tables()
    stats = {t.feature_names[0]: HOT for t in tables}
    kw = dict(
        world_size=4,
        local_world_size=4,
        global_batch_size=8192,
        device_kind="cuda",
        topology=build_topology("h100", 4),
        statistics=DatasetStatistics(stats),
        constraints={t.name: {"sharding_types": ["row_wise"]} for t in tables},
    )
    hashed = plan_tables(PlanRequest(configs=tables, **kw))
    vocab = plan_tables(
        PlanRequest(
            configs=tables, **{**kw, "statistics": DatasetStatistics(stats, ids_by_frequency=True)}
        )
    )
    assert vocab.estimate.max_step_ms > hashed.estimate.max_step_ms
    assert vocab.estimate.critical_rank == 0
