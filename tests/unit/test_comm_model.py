"""Closed-form bytes per step: worked examples (the figures gloo measured, see
tests/distributed/test_comm_volume.py) and how volume grows with the number of ranks."""

from __future__ import annotations

import pytest
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding import suites
from shardrec.sharding.cost import layouts
from shardrec.sharding.cost.comms import (
    Workload,
    collectives_per_step,
    step_comm_bytes,
    table_comm_bytes,
)
from shardrec.sharding.cost.simulate import row_wise_bytes, simulate
from shardrec.sharding.plan.plan_types import TablePlan


def _tables():
    return [
        EmbeddingBagConfig(name="t0", embedding_dim=8, num_embeddings=24, feature_names=["f0"]),
        EmbeddingBagConfig(name="t1", embedding_dim=16, num_embeddings=12, feature_names=["f1"]),
    ]


def _bytes(placed, world_size=2, local=2):
    tables = _tables()
    return step_comm_bytes(
        placed,
        {t.name: t.num_embeddings for t in tables},
        {t.name: t.embedding_dim for t in tables},
        {t.name: 3.0 for t in tables},
        Workload(4 * world_size, world_size),
        local,
    )


def test_table_wise_two_ranks() -> None:
    t0, t1 = _tables()
    got = _bytes([layouts.table_wise(t0, 1, "fused"), layouts.table_wise(t1, 0, "fused")])
    # Rank 0: t0's lengths (4 x 4 B) and ids (12 x 8 B) to rank 1, t1's pooled rows (4 x 16 x 4 B)
    # to rank 1, t0's gradients (4 x 8 x 4 B) back to rank 1, and 3 int64 split sizes.
    assert list(got["all_to_all"]) == [16 + 96 + 256 + 128 + 24, 16 + 96 + 128 + 256 + 24]
    assert got["reduce_scatter"].sum() == got["all_reduce"].sum() == 0


def test_row_wise_two_ranks() -> None:
    got = _bytes([layouts.row_wise(t, 2, "fused") for t in _tables()])
    assert list(got["all_to_all"]) == [2 * (16 + 48) + 24] * 2
    assert list(got["reduce_scatter"]) == [4 * (8 + 16) * 4] * 2
    assert list(got["all_gather"]) == list(got["reduce_scatter"])


def test_data_parallel_all_reduces_the_gradient() -> None:
    got = _bytes([layouts.data_parallel(t, 2) for t in _tables()])
    assert list(got["all_reduce"]) == [(24 * 8 + 12 * 16) * 4] * 2
    assert got["all_to_all"].sum() == 0


def test_volume_growth_with_ranks() -> None:
    ts = suites.criteo_dlrmv2()
    rows = simulate(ts.configs, ts.pooling, 512, [8, 64, 512, 4096], sync_every=100)
    rw = [r.row_wise_bytes for r in rows]
    twod = [r.twod_bytes for r in rows]
    # Row-wise per rank grows about linearly with the ranks; 2D levels off past its group size.
    assert rw[3] / rw[2] > 7
    assert twod[3] / twod[2] < 1.5
    assert twod[3] < rw[3] / 10
    assert rows[3].table_wise_max_bytes > rows[0].table_wise_max_bytes
    assert rw[0] == row_wise_bytes(ts.configs, ts.pooling, Workload(512 * 8, 8))


@pytest.mark.parametrize("hosts", [2, 3])
def test_table_row_wise_across_hosts(hosts: int) -> None:
    """t0 (24 rows x 8) table-row-wise on host 0's two ranks (rows 0-11 on rank 0, 12-23 on rank
    1), hosts of 2 ranks, 4 samples per rank, 3 ids per sample; one table, no split sizes."""
    t0, _ = _tables()
    world = 2 * hosts
    got = table_comm_bytes(
        layouts.table_row_wise(t0, 0, 2, "fused"), 24, 8, 3.0, Workload(4 * world, world), 2
    )
    # Input: each rank sends each holder but itself its 4 lengths (4 B) and half its ids (4 x 1.5 x
    # 8 B): 64 B. Pooled sums: a rank of another host gets its 4 samples' sums from the holder of
    # its local index and sends their gradients back (4 x 8 x 4 B = 128 B); a holder sends those
    # sums to its counterpart on each other host ((hosts - 1) x 128 B) and gets no gradients.
    holder = 64 + (hosts - 1) * 128
    assert list(got["all_to_all"]) == [holder, holder] + [2 * 64 + 128] * (world - 2)
    # Inside the holder host, each holder reduce-scatters to the other the partial sums of the half
    # of the global batch it hands on: (2 - 1) x (global batch / 2) x 8 x 4 B; backward all-gathers.
    assert list(got["reduce_scatter"]) == [4 * world / 2 * 8 * 4] * 2 + [0] * (world - 2)
    assert list(got["all_gather"]) == list(got["reduce_scatter"])
    assert got["all_reduce"].sum() == 0


@pytest.mark.parametrize("sharding_type", ["column_wise", "table_column_wise"])
def test_column_shards_on_two_ranks(sharding_type: str) -> None:
    """t0's 8 columns as two 4-column shards, one per rank: each rank sends the other holder its
    4 lengths and 12 ids (16 + 96 B), its shard's pooled columns for the other rank's 4 samples
    (4 x 4 x 4 B), the gradients of its own samples' other-rank columns back (64 B), and 3 int64
    split sizes."""
    t0, _ = _tables()
    got = _bytes([layouts.column_wise(t0, [0, 1], "fused", sharding_type)])
    assert list(got["all_to_all"]) == [16 + 96 + 64 + 64 + 24] * 2
    assert got["reduce_scatter"].sum() == got["all_gather"].sum() == got["all_reduce"].sum() == 0


def test_a_table_without_pooling_figures_sends_one_id_per_sample() -> None:
    t0, _ = _tables()
    got = step_comm_bytes(
        [layouts.table_wise(t0, 1, "fused")], {"t0": 24}, {"t0": 8}, {}, Workload(8, 2), 2
    )
    # Rank 0: 4 lengths and 4 ids (16 + 32 B) to rank 1, 4 x 8 x 4 B of gradients back, splits.
    assert list(got["all_to_all"]) == [16 + 32 + 128 + 24, 128 + 24]


def test_data_parallel_on_one_rank_moves_nothing() -> None:
    t0, _ = _tables()
    got = table_comm_bytes(layouts.data_parallel(t0, 1), 24, 8, 3.0, Workload(4, 1), 1)
    assert all(volume.tolist() == [0.0] for volume in got.values())


def test_an_unknown_sharding_type_is_refused_naming_the_table() -> None:
    t0, _ = _tables()
    plan = TablePlan("t0", "grid_wise", "fused", layouts.table_wise(t0, 0, "fused").shards)
    with pytest.raises(ValueError, match=r"^table t0: unknown sharding_type 'grid_wise'$"):
        table_comm_bytes(plan, 24, 8, 3.0, Workload(8, 2), 2)


def test_collectives_per_step_count_each_sharding_type_group() -> None:
    """As tests/distributed/test_comm_volume.py counts them on gloo: 5 per group with an input
    all-to-all, 7 for table-row-wise across hosts, 1 for data-parallel's gradient all-reduce."""
    assert collectives_per_step(set()) == 0
    assert collectives_per_step({"table_wise"}) == 5
    assert collectives_per_step({"table_wise", "row_wise", "column_wise"}) == 15
    assert collectives_per_step({"data_parallel"}) == 1
    assert collectives_per_step({"table_row_wise"}) == 5
    assert collectives_per_step({"table_row_wise", "data_parallel"}, num_hosts=2) == 8


def test_data_parallel_ring_all_reduce_on_four_ranks() -> None:
    """A ring all-reduce sends 2 (W - 1) / W of the gradient per rank: 1.5 x t0's 768 B."""
    t0, _ = _tables()
    got = table_comm_bytes(layouts.data_parallel(t0, 4), 24, 8, 3.0, Workload(16, 4), 4)
    assert list(got["all_reduce"]) == [1152.0] * 4


def test_two_table_row_wise_tables_on_one_host_add_up() -> None:
    """t0 and t1 table-row-wise on host 0 of two 2-rank hosts: each holder reduce-scatters half
    the global batch's (8 samples) partial sums of both tables: 8 x (8 + 16) x 4 B."""
    got = _bytes(
        [layouts.table_row_wise(t, 0, 2, "fused") for t in _tables()], world_size=4, local=2
    )
    assert list(got["reduce_scatter"]) == [8 * (8 + 16) * 4] * 2 + [0, 0]
    assert list(got["all_gather"]) == list(got["reduce_scatter"])
