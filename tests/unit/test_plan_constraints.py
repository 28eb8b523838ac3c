"""Planning under constraints and topologies: bad constraints named, kernel constraints honoured, a
topology with too little memory or a bad host size refused, 2D plans, overlapping shards."""

from __future__ import annotations

import pytest
from plan_requests import make_plan, make_tables
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding.machine.topology import build_topology
from shardrec.sharding.plan.plan_types import PlanDoesNotFitError
from shardrec.sharding.planner import plan_tables
from shardrec.sharding.search.request import PlanRequest
from shardrec.sharding.torchrec.torchrec_plans import to_sharding_plan


@pytest.mark.parametrize(
    "constraints, message",
    [
        ({"t_zz": {"sharding_types": ["row_wise"]}}, "unknown table 't_zz'"),
        ({"f1": {"sharding_types": ["row_wise"]}}, "did you mean t_f1"),
        ({"t_f1": {"sharding_types": ["diagonal"]}}, "'diagonal' is not one of"),
        ({"t_f1": {"colour": 3}}, "unknown key 'colour'"),
        ({"t_f1": {"ranks": [5]}}, "rank 5 is outside world size 2"),
        (
            {"t_f1": {"sharding_types": ["column_wise"], "min_partition": 64}},
            "t_f1: no sharding type satisfies",
        ),
        (
            {"t_f1": {"sharding_types": ["row_wise"], "ranks": [1]}},
            "t_f1: no sharding type satisfies",
        ),
        (
            {"t_f1": {"pooling_factors": [-3.0]}},
            r"^sharding.constraints.t_f1.pooling_factors = \[-3.0\]: each must be a positive",
        ),
        (
            {"t_f1": {"compute_kernels": ["dense"]}},
            r"^sharding.constraints.t_f1.compute_kernels: 'dense' is the kernel of data-parallel "
            r'tables only; add sharding_types = \["data_parallel"\], or use \'fused\'',
        ),
        (
            {"t_f1": {"compute_kernels": ["fused"], "sharding_types": ["data_parallel"]}},
            r"^sharding.constraints.t_f1.compute_kernels = \['fused'\]: a data-parallel table's "
            r"kernel is 'dense'; drop compute_kernels, or allow a sharded type",
        ),
    ],
)
def test_bad_constraints(constraints, message) -> None:
    with pytest.raises(ValueError, match=message):
        make_plan(make_tables(), constraints=constraints)


def test_a_dense_kernel_constraint_plans_a_data_parallel_table() -> None:
    cons = {"t_f1": {"compute_kernels": ["dense"], "sharding_types": ["data_parallel"]}}
    table = make_plan(make_tables(), constraints=cons).table("t_f1")
    assert (table.sharding_type, table.compute_kernel) == ("data_parallel", "dense")


def test_a_fused_kernel_constraint_never_plans_a_data_parallel_table() -> None:
    # At this batch t_f0 is cheapest data-parallel, whose one kernel is dense: before, a job
    # asking for fused got it so, and `train` then warned that the plan broke the job's constraint.
    types = ["data_parallel", "table_wise", "row_wise"]
    free = make_plan(make_tables(), batch=4096, constraints={"t_f0": {"sharding_types": types}})
    assert free.table("t_f0").sharding_type == "data_parallel"
    cons = {"t_f0": {"sharding_types": types, "compute_kernels": ["fused"]}}
    table = make_plan(make_tables(), batch=4096, constraints=cons).table("t_f0")
    assert (table.sharding_type, table.compute_kernel) == ("table_wise", "fused")


def test_zero_memory_topology_and_shortfall() -> None:
    with pytest.raises(ValueError, match="memory per rank is 0 bytes"):
        build_topology("cpu-gloo", 2, memory_bytes=0)
    topo = build_topology("cpu-gloo", 2, memory_bytes=20_000)
    with pytest.raises(PlanDoesNotFitError, match=r"rank \d needs .* of memory, .* short"):
        make_plan(make_tables(), topology=topo)


def test_ranks_constraint_is_honoured() -> None:
    plan = make_plan(
        make_tables(6),
        world_size=4,
        constraints={"t_f5": {"sharding_types": ["table_wise"], "ranks": [3]}},
    )
    assert plan.table("t_f5").ranks == [3]


def test_nothing_fits_reports_every_rank() -> None:
    topo = build_topology("cpu-gloo", 2, memory_bytes=1000)
    with pytest.raises(
        PlanDoesNotFitError,
        match=r"does not fit: 850 B of memory usable per rank \(1000 B less the reserve\); "
        r"rank 0 needs .* MiB of memory, .* MiB short; rank 1 needs",
    ):
        make_plan(make_tables(), topology=topo)


def test_2d_plan_is_a_group_plan() -> None:
    from shardrec.sharding import suites

    ts = suites.random_tasks(0, 60, max_rows=2e4)
    topo = build_topology("h100", 64)
    plan = plan_tables(
        PlanRequest(
            configs=ts.configs,
            world_size=64,
            local_world_size=8,
            global_batch_size=64 * 512,
            device_kind="cuda",
            topology=topo,
            sharding_group_size=8,
            sync_every=10,
        )
    )
    assert plan.sharding_group_size == 8 and plan.fingerprint.world_size == 64
    assert max(r for t in plan.tables for r in t.ranks) < 8
    assert len(plan.estimate.ranks) == 8 and plan.estimate.ranks[0].bytes_sent["all_reduce"] > 0
    sp = to_sharding_plan(plan, ts.configs, "ebc", 64, 8, "cuda")
    assert len(sp.plan["ebc"]) == 60
    with pytest.raises(ValueError, match="must be positive and divide world size 64"):
        make_plan(ts.configs, world_size=64, batch=64 * 8, sharding_group_size=24)


def test_overlapping_shards_that_leave_a_gap_are_refused():
    from shardrec.sharding.plan.plan_types import Shard, TablePlan
    from shardrec.sharding.torchrec.torchrec_plans import check_shards

    cfg = EmbeddingBagConfig(name="t", embedding_dim=8, num_embeddings=10, feature_names=["f"])
    # Same total area as the table, but rows 0-4 twice and rows 5-9 never.
    overlapping = TablePlan("t", "row_wise", "fused", [Shard(0, 0, 0, 5, 8), Shard(1, 0, 0, 5, 8)])
    with pytest.raises(ValueError, match="table t: shards overlap"):
        check_shards(overlapping, cfg, world_size=2)
    gap = TablePlan("t", "row_wise", "fused", [Shard(0, 0, 0, 4, 8), Shard(1, 5, 0, 5, 8)])
    with pytest.raises(ValueError, match="uncovered"):
        check_shards(gap, cfg, world_size=2)
    tiled = TablePlan("t", "column_wise", "fused", [Shard(0, 0, 0, 10, 4), Shard(1, 0, 4, 10, 4)])
    check_shards(tiled, cfg, world_size=2)


def test_explicit_ranks_per_host_must_divide_the_world_size():
    with pytest.raises(
        ValueError, match="local_world_size = 5 must be > 0 and divide world_size = 2"
    ):
        build_topology("cpu-gloo", world_size=2, local_world_size=5)
    assert (
        build_topology("a100", world_size=4).local_world_size == 4
    )  # preset host shrinks to the job
