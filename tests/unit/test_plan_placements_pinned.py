"""Placements of tables that fit are pinned: a change to the memory model, the presets or the
reservation must not move a table that fits, unless a measured comparison says it should
(then the hashes here change in the same commit as that evidence)."""

from __future__ import annotations

import hashlib
import json

import pytest

from shardrec.sharding import suites
from shardrec.sharding.machine.topology import build_topology
from shardrec.sharding.planner import plan_tables
from shardrec.sharding.search.request import PlanRequest


def _table_set(spec: str) -> suites.TableSet:
    if spec == "criteo26":
        return suites.criteo_dlrmv2()
    if (
        spec == "demo-shaped"
    ):  # bench plan-reality's tables: criteo's 26 capped at 50,000 rows, dim 16, one-hot
        configs = [
            suites.table_config(i, min(c.num_embeddings, 50_000), 16)
            for i, c in enumerate(suites.criteo_dlrmv2(16).configs)
        ]
        return suites.TableSet(spec, configs, {c.name: 1.0 for c in configs})
    _, seed, count, *max_rows = spec.split(":")
    return suites.random_tasks(int(seed), int(count), *(float(a) for a in max_rows))


# case -> sha256[:16] of the placement (name, sharding type, kernel, shards) as planned on main
# 4a31334.
PINNED = {
    ("criteo26", "h100", 8, 65536): "36441fafcdc18f1e",
    ("criteo26", "a100", 16, 65536): "b83bd61c515fc4a1",
    ("random:0:40", "a100", 4, 16384): "6b2db3b435a84850",
    ("random:1:60", "h100", 8, 32768): "f1309eacd2af2641",
    ("random:3:100", "h200", 8, 32768): "cc1e9f9bbeeed448",
    ("random:4:50:1e6", "cpu-gloo", 2, 4096): "350fc86a70f2e8c5",
    ("random:5:30:1e5", "cpu-gloo", 4, 4096): "5c1c67148cb13633",
    ("demo-shaped", "cpu-gloo", 2, 2048): "819c0b3d6ac85b8b",
}


@pytest.mark.parametrize("case", list(PINNED), ids=lambda c: f"{c[0]}/{c[1]}x{c[2]}")
def test_placement_of_tables_that_fit_is_unchanged(case) -> None:
    spec, preset, world_size, batch = case
    ts = _table_set(spec)
    topo = build_topology(preset, world_size)
    request = PlanRequest(
        configs=ts.configs,
        world_size=world_size,
        local_world_size=topo.local_world_size,
        global_batch_size=batch,
        device_kind=topo.device_kind,
        topology=topo,
        constraints={c.name: {"pooling_factors": [ts.pooling[c.name]]} for c in ts.configs},
    )
    plan = plan_tables(request)
    placed = [
        [
            t.name,
            t.sharding_type,
            t.compute_kernel,
            [[s.rank, s.row_offset, s.col_offset, s.rows, s.cols] for s in t.shards],
        ]
        for t in plan.tables
    ]
    digest = hashlib.sha256(json.dumps(placed, sort_keys=True).encode()).hexdigest()[:16]
    assert digest == PINNED[case]
