"""Calibration profiles: the lookup measurement runs, and a profile's figures reach the topology."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from shardrec.sharding.machine.topology import build_topology
from shardrec.tools.measure.calibrate import measure_lookup, save_profile


def test_lookup_measurement_is_positive() -> None:
    got = measure_lookup("cpu", rows=2000, dim=8, batch=64, pooling=2, repeats=2)
    # The bandwidth is the rows read (batch x pooling x dim x 4 bytes) over the forward time.
    assert got["lookup_bytes"] == 64 * 2 * 8 * 4
    assert got["lookup_fwd_s"] > 0
    assert got["lookup_bw"] == pytest.approx(got["lookup_bytes"] / got["lookup_fwd_s"])


def test_profile_figures_reach_the_topology(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    save_profile(
        {
            "format": "shardrec-calibration",
            "measured": {"lookup_bw": 1.5e9, "intra_host_bw": 3e8, "collective_latency_s": 4e-4},
        },
        path,
    )
    topo = build_topology("cpu-gloo", 2, profile=path)
    assert (topo.lookup_bw, topo.intra_host_bw, topo.collective_latency_s) == (1.5e9, 3e8, 4e-4)
    assert topo.inter_host_bw == build_topology("cpu-gloo", 2).inter_host_bw


def test_bad_profiles_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"measured": {"lookup_bw": -1}}))
    with pytest.raises(
        ValueError, match=f"{path}: measured.lookup_bw = -1 must be a positive number"
    ):
        build_topology("cpu-gloo", 2, profile=path)
    path.write_text(json.dumps({"something": 1}))
    with pytest.raises(ValueError, match="no 'measured' section"):
        build_topology("cpu-gloo", 2, profile=path)
    with pytest.raises(ValueError, match="preset 'tpu' is not one of"):
        build_topology("tpu", 2)


def test_profile_picks_the_cost_model_and_memory_figures(tmp_path: Path) -> None:
    from shardrec.sharding import suites
    from shardrec.sharding.planner import plan_tables, priced_by
    from shardrec.sharding.search.request import PlanRequest, SearchRequest
    from shardrec.sharding.search.shardrec_search import search_plan

    path = tmp_path / "profile.json"
    save_profile(
        {
            "format": "shardrec-calibration",
            "measured": {"lookup_bw": 1.5e9},
            "cost_model": {"winner": "torchrec", "evidence": "bench plan-reality"},
            "memory": {"framework_bytes": 12345678, "replicated_copies": 3.5},
        },
        path,
    )
    topo = build_topology("cpu-gloo", 2, profile=path)
    assert topo.cost_model == "torchrec"
    assert (topo.memory.framework_bytes, topo.memory.replicated_copies, topo.memory.io_copies) == (
        12345678,
        3.5,
        1.0,
    )
    ts = suites.random_tasks(4, 12, max_rows=1e5)
    request = PlanRequest(
        configs=ts.configs,
        world_size=2,
        local_world_size=2,
        global_batch_size=4096,
        device_kind="cpu",
        topology=topo,
    )
    plan = plan_tables(request)
    assert plan.estimate.cost_model == "torchrec"
    assert min(r.fixed_bytes for r in plan.estimate.ranks) >= 12345678
    search_request = SearchRequest(
        configs=ts.configs,
        topology=topo,
        global_batch_size=4096,
        pooling=dict.fromkeys(ts.pooling, 1.0),
    )
    searched = search_plan(search_request, problem=priced_by(search_request, "torchrec"))
    assert [t.shards for t in plan.tables] == [t.shards for t in searched]
    default = dataclasses.replace(request, topology=build_topology("cpu-gloo", 2))
    assert plan_tables(default).estimate.cost_model == "shardrec"


def test_bad_verdicts_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"measured": {}, "cost_model": {"winner": "oracle"}}))
    with pytest.raises(
        ValueError, match=f"{path}: cost_model.winner = 'oracle' is not one of shardrec, torchrec"
    ):
        build_topology("cpu-gloo", 2, profile=path)
    path.write_text(json.dumps({"measured": {}, "memory": {"framework_bytes": "lots"}}))
    with pytest.raises(
        ValueError, match=f"{path}: memory.framework_bytes is 'lots', expected a number"
    ):
        build_topology("cpu-gloo", 2, profile=path)
