"""Tables past HBM: UVM caches sized from the data's id frequencies, their predicted hit rates held
against exact caches replaying the stream, the plan file and report showing them, and a refusal
with each rank's gap per memory tier when even caching cannot fit."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest
from rich.console import Console

from shardrec.sharding import suites
from shardrec.sharding.cost.hit_rates import (
    curve_from_counts,
    lfu_hit_rate,
    lru_hit_rate,
    min_cache_rows,
    slots,
)
from shardrec.sharding.machine.topology import build_topology
from shardrec.sharding.plan.plan_file import load_plan, save_plan
from shardrec.sharding.plan.plan_types import PlanDoesNotFitError, PlanFile
from shardrec.sharding.plan.report import tables_table
from shardrec.sharding.planner import plan_tables
from shardrec.sharding.search.request import DatasetStatistics, PlanRequest
from shardrec.sharding.torchrec.torchrec_plans import to_sharding_plan
from shardrec.tools.bench.plan.cache_sim import BatchLFU, BatchLRU

GiB = 2**30


def _zipf_stream(rows: int, lookups: int, batches: int, a: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    p = np.arange(1, rows + 1, dtype=np.float64) ** -a
    cdf = np.cumsum(p / p.sum())
    hashed = rng.permutation(rows)  # hashed ids: the hot ones anywhere in the table
    return [
        hashed[np.minimum(np.searchsorted(cdf, rng.random(lookups)), rows - 1)]
        for _ in range(batches)
    ]


@pytest.mark.parametrize("a", [1.05, 1.3])
def test_predicted_hit_rates_match_exact_caches_within_two_points(a: float) -> None:
    rows, stream = 50_000, _zipf_stream(50_000, 2048, 120, a, seed=int(a * 100))
    curve = curve_from_counts(
        np.bincount(np.concatenate(stream), minlength=rows), rows, len(stream)
    )
    for load_factor in (0.1, 0.2, 0.4):
        capacity = slots(rows, load_factor)
        assert capacity >= min_cache_rows(curve)
        for cache, predict in (
            (BatchLRU(capacity, rows), lru_hit_rate),
            (BatchLFU(capacity, rows), lfu_hit_rate),
        ):
            got = np.sum([cache.step(ids) for ids in stream], axis=0)
            want = predict(curve, capacity)
            assert abs(want.unique_hit_rate - got[1] / got[0]) <= 0.02, (
                type(cache).__name__,
                load_factor,
            )
            assert abs(want.lookup_hit_rate - got[3] / got[2]) <= 0.02, (
                type(cache).__name__,
                load_factor,
            )
    # A cache of a tenth of the rows hits far more than a tenth of a skewed table's rows (torchrec's
    # assumption).
    assert lru_hit_rate(curve, slots(rows, 0.1)).unique_hit_rate > 0.3


def _past_hbm(memory_gib: float, host_gib: float = 192.0):
    """Criteo's 26 tables (capped at 2 M rows, 16 wide: 0.8 GiB with Adagrad) on one GPU of
    `memory_gib`."""
    configs = [
        suites.table_config(i, min(r, 2_000_000), 16) for i, r in enumerate(suites.DLRMV2_ROWS)
    ]
    rng = np.random.default_rng(0)
    curves = {}
    for config in configs:
        n = config.num_embeddings
        p = np.arange(1, n + 1, dtype=np.float64) ** -1.1
        curves[config.name] = curve_from_counts(rng.poisson(p / p.sum() * 4096 * 200), n, 200)
    topo = dataclasses.replace(
        build_topology("h100", 1, memory_bytes=int(memory_gib * GiB)),
        host_memory_bytes=int(host_gib * GiB),
    )
    return PlanRequest(
        configs=configs,
        world_size=1,
        local_world_size=1,
        global_batch_size=4096,
        device_kind="cuda",
        topology=topo,
        statistics=DatasetStatistics(frequencies=curves),
    )


def test_tables_past_hbm_get_caches_sized_by_their_hit_rates(tmp_path) -> None:
    plan = plan_tables(_past_hbm(0.5))
    cached = [t for t in plan.tables if t.compute_kernel == "fused_uvm_caching"]
    assert cached and all(t.cache is not None for t in cached)
    for t in cached:
        assert 0 < t.cache.load_factor < 1
        assert t.cache.rows == [slots(s.rows, t.cache.load_factor) for s in t.shards]
        assert all(
            t.cache.load_factor < h < 1 for h in t.cache.hit_rates
        )  # skew: more hits than rows cached
    rank = plan.estimate.ranks[0]
    assert rank.memory_bytes <= plan.estimate.memory_capacity_bytes and rank.host_bytes > 0
    # The plan file carries kernel, cache rows and hit rates, and torchrec gets the load factor.
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    loaded = load_plan(path)
    assert loaded.to_json() == plan.to_json()
    configs = _past_hbm(0.5).configs
    sharding = to_sharding_plan(loaded, configs, "", 1, 1, "cuda").plan[""]
    assert sharding[cached[0].name].cache_params.load_factor == cached[0].cache.load_factor
    # The report shows each cached table's cache rows and predicted hit rate.
    out = io.StringIO()
    Console(file=out, width=160).print(tables_table(plan))
    text = out.getvalue()
    assert "cache rows" in text and "hit rate" in text and f"{sum(cached[0].cache.rows):,}" in text


def test_tables_that_cannot_fit_even_cached_are_refused_per_rank_and_tier() -> None:
    with pytest.raises(PlanDoesNotFitError) as e:
        plan_tables(_past_hbm(0.5, host_gib=0.25))
    assert (
        "rank 0 needs" in str(e.value)
        and "of host memory" in str(e.value)
        and "short" in str(e.value)
    )
    with pytest.raises(PlanDoesNotFitError, match=r"rank 0 needs .* of HBM, .* short"):
        plan_tables(_past_hbm(0.02))
    no_data = dataclasses.replace(_past_hbm(0.5), statistics=DatasetStatistics())
    with pytest.raises(
        PlanDoesNotFitError, match="needs the data's id frequencies, which `shardrec plan` counts"
    ):
        plan_tables(no_data)


def test_cached_tables_need_cuda_in_a_plan_file(tmp_path) -> None:
    plan = plan_tables(_past_hbm(0.5))
    raw = plan.to_json().replace('"device_kind": "cuda"', '"device_kind": "cpu"')
    path = tmp_path / "plan.json"
    path.write_text(raw)
    with pytest.raises(
        ValueError, match="compute_kernel fused_uvm_caching needs CUDA, the plan is for cpu"
    ):
        load_plan(path)
    assert PlanFile.from_json(plan.to_json()).tables == plan.tables
