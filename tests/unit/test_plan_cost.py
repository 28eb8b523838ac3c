"""The cost model's figures worked by hand on a topology of round numbers (sharding/cost/
cost_model.py): per-rank memory, lookup seconds, communication seconds, the slowest rank, the
shortfalls the planner reports, and host memory and transfers of UVM tables."""

from __future__ import annotations

import dataclasses

import pytest
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding.cost import layouts
from shardrec.sharding.cost.cost_model import evaluate, table_cost
from shardrec.sharding.machine.memory import MemoryModel
from shardrec.sharding.machine.topology import ClusterTopology
from shardrec.sharding.plan.plan_types import CachePlan

T0 = EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=24, feature_names=["f0"])
T1 = EmbeddingBagConfig(name="t1", embedding_dim=16, num_embeddings=12, feature_names=["f1"])
POOLING = {"t0": 1.0, "t1": 1.0}


def _topology(world_size: int = 2, local_world_size: int = 2, **figures) -> ClusterTopology:
    """Bytes/s of 1,000 inside a host, 500 across hosts, 100 of lookups, 1,000 to host memory;
    1 ms per collective; 1,000 bytes of framework per rank."""
    values = dict(
        name="round",
        world_size=world_size,
        local_world_size=local_world_size,
        device_kind="cpu",
        memory_bytes=100_000,
        intra_host_bw=1000.0,
        inter_host_bw=500.0,
        lookup_bw=100.0,
        collective_latency_s=0.001,
        host_link_bw=1000.0,
        memory_model=MemoryModel(framework_bytes=1000.0),
    )
    return ClusterTopology(**{**values, **figures})


def _placed():
    # t0 whole on rank 1; t1 row-wise: rows 0-5 on rank 0, rows 6-11 on rank 1.
    return [layouts.table_wise(T0, 1, "fused"), layouts.row_wise(T1, 2, "fused")]


def test_a_placement_on_one_host_worked_by_hand() -> None:
    cost = evaluate(_placed(), [T0, T1], POOLING, _topology(), 8, "sgd")
    assert list(cost.weights_bytes) == [6 * 16 * 4, 24 * 8 * 4 + 6 * 16 * 4]
    # Per step: 8 samples' ids (8 B each, t1's shared between its shards) and their pooled rows
    # forward and backward (2 x cols x 4 B): t0 8 x (8 + 64), t1 8 x (4 + 128) on each rank.
    assert list(cost.buffer_bytes) == [1056, 576 + 1056]
    assert cost.fixed_bytes == 1000  # the framework; no dense layers given
    assert list(cost.memory_bytes) == [384 + 1056 + 1000, 1152 + 1632 + 1000]
    # Rows read forward: t0 8 x 8 x 4 B on rank 1, half of t1's 8 x 16 x 4 B on each; backward
    # twice the forward; 100 B/s.
    assert list(cost.lookup_s) == pytest.approx([256 * 3 / 100, 512 * 3 / 100])
    # Bytes sent (as test_comm_model works them): all-to-all 256 and 208, reduce-scatter and
    # all-gather 256 each, at 1,000 B/s; two sharding type groups of 5 collectives, 1 ms each.
    assert list(cost.comm_bytes["all_to_all"]) == [256, 208]
    assert list(cost.comm_s) == pytest.approx([0.768 + 0.01, 0.72 + 0.01])
    assert cost.max_step_s == pytest.approx(15.36 + 0.73) and cost.critical_rank == 1
    assert cost.memory_capacity == 85_000 and cost.device_memory == 100_000
    assert cost.shortfall() == {} and cost.host_shortfall() == {}


def test_ranks_on_two_hosts_send_at_the_slower_rate() -> None:
    cost = evaluate(_placed(), [T0, T1], POOLING, _topology(local_world_size=1), 8, "sgd")
    assert list(cost.comm_s) == pytest.approx([768 / 500 + 0.01, 720 / 500 + 0.01])


def test_one_rank_sends_nothing_and_starts_no_collective() -> None:
    placed = [layouts.table_wise(T0, 0, "fused"), layouts.table_wise(T1, 0, "fused")]
    cost = evaluate(placed, [T0, T1], POOLING, _topology(1, 1), 8, "sgd")
    assert list(cost.comm_s) == [0.0] and list(cost.step_s) == list(cost.lookup_s)


def test_the_shortfall_names_each_rank_over_its_memory() -> None:
    cost = evaluate(_placed(), [T0, T1], POOLING, _topology(memory_bytes=4000), 8, "sgd")
    assert cost.memory_capacity == 3400 and cost.shortfall() == {1: 3784 - 3400}


def test_the_report_of_each_rank() -> None:
    report = evaluate(_placed(), [T0, T1], POOLING, _topology(), 8, "sgd").to_dict()
    assert report["critical_rank"] == 1 and report["max_step_ms"] == pytest.approx(16090.0)
    assert report["memory_capacity_bytes"] == 85_000 and report["device_memory_bytes"] == 100_000
    assert report["host_capacity_bytes"] == 0
    assert report["ranks"][1] == {
        "rank": 1,
        "memory_bytes": 3784,
        "weights_bytes": 1152,
        "optimizer_bytes": 0,
        "buffer_bytes": 1632,
        "fixed_bytes": 1000,
        "cache_bytes": 0,
        "host_bytes": 0,
        "id_map_bytes": 0,
        "lookup_ms": pytest.approx(15360.0),
        "comm_ms": pytest.approx(730.0),
        "step_ms": pytest.approx(16090.0),
        "bytes_sent": {
            "all_to_all": 208,
            "reduce_scatter": 256,
            "all_gather": 256,
            "all_reduce": 0,
        },
    }


def test_a_data_parallel_table_holds_its_gradient_and_ddp_bucket_on_every_rank() -> None:
    cost = evaluate([layouts.data_parallel(T0, 2)], [T0], POOLING, _topology(), 8, "sgd")
    assert list(cost.weights_bytes) == [768, 768]
    assert list(cost.buffer_bytes) == [2 * 768, 2 * 768]  # 3 copies at the peak in all
    assert list(cost.lookup_s) == pytest.approx([4 * 8 * 4 * 3 / 100] * 2)  # local samples only
    assert list(cost.comm_bytes["all_reduce"]) == [768, 768]
    assert list(cost.comm_s) == pytest.approx([0.768 + 0.001] * 2)  # one all-reduce


def test_a_uvm_table_keeps_weights_and_optimizer_state_in_host_memory() -> None:
    """fused_uvm, Adam: t0's weights (768 B) and moments (1,536 B) leave rank 1's device for its
    host memory; every forward and backward read crosses the host link at a tenth of its rate."""
    placed = [layouts.table_wise(T0, 1, "fused_uvm")]
    topology = _topology(host_memory_bytes=2000)
    cost = evaluate(placed, [T0], POOLING, topology, 8, "adam")
    assert list(cost.weights_bytes) == [0, 0] and list(cost.optimizer_bytes) == [0, 0]
    assert list(cost.host_bytes) == [0, 768 + 1536]
    assert list(cost.lookup_s) == pytest.approx([0, 256 * 3 / 100 + 256 * 3 / 100])
    assert cost.host_shortfall() == {1: 2304 - 2000}
    one = table_cost(placed[0], T0, 1.0, topology, 8, "adam")
    assert list(one.host_bytes) == [0, 2304] and list(one.memory_bytes) == [0, 576]


def test_a_cached_uvm_table_keeps_its_cache_and_row_state_on_the_device() -> None:
    """fused_uvm_caching, row-wise Adagrad: weights in host memory; the 4-byte row state, the 12
    cached rows (384 B), fbgemm's 4 B per row and 16 B per slot stay on the device; each missed
    row (2 a batch) is fetched and written back."""
    plan = dataclasses.replace(
        layouts.table_wise(T0, 1, "fused_uvm_caching"),
        cache=CachePlan(load_factor=0.5, rows=[12], hit_rates=[0.9], fetched_rows=[2.0]),
    )
    cost = evaluate([plan], [T0], POOLING, _topology(), 8, "rowwise_adagrad")
    assert list(cost.host_bytes) == [0, 768] and list(cost.optimizer_bytes) == [0, 24 * 4]
    assert list(cost.cache_bytes) == [0, 12 * 8 * 4 + 24 * 4 + 12 * 16]
    assert list(cost.lookup_s) == pytest.approx([0, 256 * 3 / 100 + 2 * 2 * 8 * 4 / 1000])
    assert cost.to_dict()["ranks"][1]["cache_bytes"] == 672


def test_one_byte_over_is_a_shortfall() -> None:
    """Rank 1 needs 3,784 bytes (worked above); a rank of 3,783 usable bytes cannot hold it, and
    a UVM table one byte over its host memory does not fit either."""
    topology = _topology(memory_bytes=3783, reserve_fraction=0.0)
    cost = evaluate(_placed(), [T0, T1], POOLING, topology, 8, "sgd")
    assert cost.shortfall() == {1: 1}
    uvm = [layouts.table_wise(T0, 1, "fused_uvm")]
    cost = evaluate(uvm, [T0], POOLING, _topology(host_memory_bytes=767), 8, "sgd")
    assert cost.host_shortfall() == {1: 1}


def test_lookups_and_buffers_scale_with_the_ids_per_sample() -> None:
    """Three ids per sample of t0 (table-wise on rank 0): three times the rows read and ids held."""
    pooling = {"t0": 3.0, "t1": 2.0}
    cost = evaluate([layouts.table_wise(T0, 0, "fused")], [T0], pooling, _topology(), 8, "sgd")
    assert list(cost.lookup_s) == pytest.approx([8 * 3 * 8 * 4 * 3 / 100, 0])
    assert list(cost.buffer_bytes) == [8 * (3 * 8 + 2 * 8 * 4), 0]
    # Data-parallel t0 and t1 on both ranks: each rank reads its 4 samples' ids of both tables.
    both = [layouts.data_parallel(T0, 2), layouts.data_parallel(T1, 2)]
    cost = evaluate(both, [T0, T1], pooling, _topology(), 8, "sgd")
    assert list(cost.lookup_s) == pytest.approx([(4 * 3 * 8 + 4 * 2 * 16) * 4 * 3 / 100] * 2)


def test_two_column_shards_on_one_rank_hold_both_buffers() -> None:
    """t0's two 4-column shards both on rank 0: each holds the 8 samples' ids and its pooled
    columns forward and backward, 8 x (8 + 2 x 4 x 4) bytes."""
    cost = evaluate(
        [layouts.column_wise(T0, [0, 0], "fused")], [T0], POOLING, _topology(), 8, "sgd"
    )
    assert list(cost.buffer_bytes) == [2 * 8 * (8 + 32), 0]


def test_a_cache_without_a_miss_prediction_adds_no_transfer_time() -> None:
    plan = dataclasses.replace(
        layouts.table_wise(T0, 1, "fused_uvm_caching"),
        cache=CachePlan(load_factor=0.5, rows=[12], hit_rates=[0.9]),
    )
    cost = evaluate([plan], [T0], POOLING, _topology(), 8, "rowwise_adagrad")
    assert list(cost.lookup_s) == pytest.approx([0, 256 * 3 / 100])


def test_an_unpooled_table_holds_a_row_per_id_in_its_buffers() -> None:
    """A sequence model's table (pooling NONE) returns one row per id, not one per sample: with 5
    ids a sample, its output and gradient buffers are 5 times a pooled table's."""
    from torchrec.modules.embedding_configs import PoolingType

    unpooled = dataclasses.replace(T0, pooling=PoolingType.NONE)
    pooling = {"t0": 5.0}
    placed = [layouts.table_wise(T0, 1, "fused")]
    bag = evaluate(placed, [T0], pooling, _topology(), 8, "sgd")
    seq = evaluate([layouts.table_wise(unpooled, 1, "fused")], [unpooled], pooling, _topology(), 8)
    # 8 samples x 5 ids (8 B each) and the rows out, forward and backward (2 x 8 cols x 4 B):
    # pooled one row a sample, unpooled 5.
    assert list(bag.buffer_bytes) == [0, 8 * (5 * 8 + 1 * 64)]
    assert list(seq.buffer_bytes) == [0, 8 * (5 * 8 + 5 * 64)]
    # Rank 1 sends rank 0's 4 samples 5 rows each instead of one (rank 0 the gradients back).
    assert seq.comm_bytes["all_to_all"][1] - bag.comm_bytes["all_to_all"][1] == 4 * 4 * 8 * 4
    assert seq.comm_bytes["all_to_all"][0] - bag.comm_bytes["all_to_all"][0] == 4 * 4 * 8 * 4
