"""Closed-form bytes per step: worked examples (the figures gloo measured, see
tests/distributed/test_comm_volume.py) and how volume grows with the number of ranks."""

from __future__ import annotations

import pytest
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding import suites
from shardrec.sharding.cost import layouts
from shardrec.sharding.cost.comms import Workload, step_comm_bytes, table_comm_bytes
from shardrec.sharding.cost.simulate import row_wise_bytes, simulate


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
