"""shardrec's search: deterministic, within memory and constraints, never worse than simple
placements."""

from __future__ import annotations

import pytest

from shardrec.sharding import suites
from shardrec.sharding.cost import layouts
from shardrec.sharding.cost.cost_model import evaluate
from shardrec.sharding.machine.topology import build_topology
from shardrec.sharding.plan.constraints import parse_constraints
from shardrec.sharding.planner import plan_tables
from shardrec.sharding.search.request import PlanRequest, SearchRequest
from shardrec.sharding.search.shardrec_search import search_plan


def _request(ts: suites.TableSet, topo, batch: int, constraints=None) -> SearchRequest:
    return SearchRequest(
        configs=ts.configs,
        topology=topo,
        global_batch_size=batch,
        pooling=ts.pooling,
        constraints=constraints or {},
    )


def _lpt_table_wise(tables, pooling, topo, batch):
    """A simple baseline: every table whole, largest lookup volume first on the least-loaded
    rank."""
    load = [0.0] * topo.world_size
    out = []
    for t in sorted(tables, key=lambda t: -t.embedding_dim * pooling[t.name]):
        r = min(range(topo.world_size), key=lambda r: (load[r], r))
        load[r] += t.embedding_dim * pooling[t.name]
        out.append(layouts.table_wise(t, r, "fused"))
    return out


@pytest.mark.parametrize(
    "seed, n, preset, world", [(0, 30, "h100", 8), (1, 60, "a100", 16), (2, 40, "cpu-gloo", 4)]
)
def test_search_beats_simple_placements(seed, n, preset, world) -> None:
    ts = suites.random_tasks(seed, n, max_rows=1e6)
    topo = build_topology(preset, world)
    batch = 1024 * world
    ours = evaluate(search_plan(_request(ts, topo, batch)), ts.configs, ts.pooling, topo, batch)
    tw = evaluate(
        _lpt_table_wise(ts.configs, ts.pooling, topo, batch), ts.configs, ts.pooling, topo, batch
    )
    rw = evaluate(
        [layouts.row_wise(t, world, "fused") for t in ts.configs],
        ts.configs,
        ts.pooling,
        topo,
        batch,
    )
    assert ours.max_step_s <= tw.max_step_s * 1.000001
    assert ours.max_step_s <= rw.max_step_s * 1.000001
    assert not ours.shortfall()


def test_same_inputs_give_byte_identical_plans() -> None:
    ts = suites.random_tasks(3, 80)
    request = PlanRequest(
        configs=ts.configs,
        world_size=16,
        local_world_size=8,
        global_batch_size=16 * 512,
        device_kind="cuda",
        topology=build_topology("h100", 16),
    )
    a = plan_tables(request).to_json()
    b = plan_tables(request).to_json()
    assert a == b


def test_every_table_covered_and_within_memory() -> None:
    ts = suites.criteo_dlrmv2()
    topo = build_topology("h100", 8)
    placed = search_plan(_request(ts, topo, 65536))
    by_name = {t.name: t for t in ts.configs}
    for tp in placed:
        cfg = by_name[tp.name]
        area = sum(s.rows * s.cols for s in tp.shards)
        if tp.sharding_type != "data_parallel":
            assert area == cfg.num_embeddings * cfg.embedding_dim, tp.name
    cost = evaluate(placed, ts.configs, ts.pooling, topo, 65536)
    assert cost.memory_bytes.max() <= topo.memory_bytes


def test_memory_pressure_forces_splitting() -> None:
    ts = suites.criteo_dlrmv2()
    # 40 M x 128 fp32 = 20 GB per big table: with 16 GiB per rank they cannot stay whole.
    topo = build_topology("h100", 16, memory_bytes=16 * 2**30)
    placed = search_plan(_request(ts, topo, 65536))
    big = [tp for tp in placed if tp.name in ("t_0", "t_9", "t_19", "t_20", "t_21")]
    assert all(len({s.rank for s in tp.shards}) > 1 for tp in big)
    assert not evaluate(placed, ts.configs, ts.pooling, topo, 65536).shortfall()


def test_constraints_are_honoured() -> None:
    ts = suites.random_tasks(5, 12, max_rows=1e5)
    topo = build_topology("cpu-gloo", 4)
    raw = {
        "t_0": {"sharding_types": ["row_wise"]},
        "t_1": {"sharding_types": ["table_wise"], "ranks": [2]},
        "t_2": {"sharding_types": ["column_wise", "table_column_wise"], "min_partition": 8},
        "t_3": {"sharding_types": ["data_parallel"]},
    }
    placed = {
        t.name: t
        for t in search_plan(_request(ts, topo, 4096, parse_constraints(raw, ts.configs, 4)))
    }
    assert placed["t_0"].sharding_type == "row_wise"
    assert placed["t_1"].sharding_type == "table_wise" and placed["t_1"].ranks == [2]
    assert placed["t_2"].sharding_type in ("column_wise", "table_column_wise")
    assert all(s.cols >= 8 for s in placed["t_2"].shards)
    assert (
        placed["t_3"].sharding_type == "data_parallel" and placed["t_3"].compute_kernel == "dense"
    )


@pytest.mark.parametrize("world_size", [2, 4])
def test_a_column_wise_table_spans_two_ranks_at_least(world_size: int) -> None:
    """A table's column blocks all on one rank cut columns for nothing a whole table there does
    not (and at 1 rank column-wise is refused for that reason); several blocks on one rank of
    many still even out loads, as torchrec allows."""
    for seed in range(6):
        ts = suites.random_tasks(seed, 10, max_rows=1e5)
        raw = {f"t_{i}": {"sharding_types": ["column_wise"]} for i in range(4)}
        topo = build_topology("cpu-gloo", world_size)
        request = _request(ts, topo, 4096, parse_constraints(raw, ts.configs, world_size))
        for table in search_plan(request):
            if table.sharding_type == "column_wise":
                ranks = [s.rank for s in table.shards]
                assert len(set(ranks)) >= 2, (seed, table.name, ranks)


def test_a_replicated_table_that_overflows_is_not_taken_for_a_fit() -> None:
    """Data-parallel would be fastest but its three copies overflow a rank: the search shards the
    table instead of returning a placement the planner then refuses."""
    configs = [suites.table_config(0, 30_000, 16)]
    request = PlanRequest(
        configs=configs,
        world_size=2,
        local_world_size=2,
        global_batch_size=4096,
        device_kind="cpu",
        topology=build_topology("cpu-gloo", 2, memory_bytes=54_000_000),
        constraints={"t_0": {"pooling_factors": [50.0]}},
    )
    plan = plan_tables(request)
    assert plan.tables[0].sharding_type == "row_wise"
    assert all(r.memory_bytes <= plan.estimate.memory_capacity_bytes for r in plan.estimate.ranks)


def test_an_unknown_constrained_table_is_met_with_every_table_name() -> None:
    """The refusal lists the tables as the other refusals list names: all where they are few (it
    stopped at 8 and '...', hiding the one meant)."""
    ts = suites.random_tasks(0, 12, max_rows=1e3)
    with pytest.raises(ValueError) as e:
        parse_constraints({"tx": {"sharding_types": ["row_wise"]}}, ts.configs, 2)
    tables = ", ".join(sorted(c.name for c in ts.configs))
    assert str(e.value) == f"sharding.constraints.tx: unknown table 'tx' (tables: {tables})"
