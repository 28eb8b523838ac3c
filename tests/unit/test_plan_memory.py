"""The planner's per-rank memory, worked by hand: the weights and the sparse optimizer's state
each rank holds under a placement (sharding.cost.evaluate), as test_comm_model works bytes sent."""

from __future__ import annotations

from pathlib import Path

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


def test_every_rank_holds_the_managed_tables_id_maps_at_their_largest() -> None:
    """The id maps are replicas: their bytes join every rank's fixed memory on CPU (host memory on
    CUDA, reported beside it), as large as a map filled to its budget with a full window of misses
    gets."""
    import numpy as np

    from shardrec.embeddings.managed.id_map import combine
    from shardrec.embeddings.managed.map_memory import id_map_bytes
    from shardrec.embeddings.managed.maps import build_maps
    from shardrec.embeddings.managed.table_kinds import TableSettings
    from shardrec.sharding.machine.memory import DenseFootprint

    settings = TableSettings(kind="managed", rows=1000, admit_after=1, evict_every=4)
    window = 64 * 4  # a local batch of 64 one-hot ids, 4 steps between updates
    estimate = id_map_bytes(settings, window, 2)
    placed = [layouts.table_wise(T0, 1, "fused"), layouts.row_wise(T1, 2, "fused")]
    args = ([T0, T1], {"t0": 1.0, "t1": 1.0}, build_topology("cpu-gloo", 2), 8, "sgd")
    plain = evaluate(placed, *args, dense=DenseFootprint())
    managed = evaluate(placed, *args, dense=DenseFootprint(id_map_bytes=estimate))
    assert managed.fixed_bytes - plain.fixed_bytes == estimate
    assert managed.to_dict()["ranks"][1]["id_map_bytes"] == estimate
    maps = build_maps({"f": ("t_f", settings)})
    maps.begin_stretch(0, 100)
    rng = np.random.default_rng(0)
    peak = 0
    for step in range(40):  # new ids every step: the map fills and the misses pile up
        for table in maps.due(step):
            maps.update(table, combine([table.idmap.pending()]), step)
        keys = rng.integers(1, 2**62, 64).astype(np.uint64)
        maps.rows("f", keys, np.ones(64, bool), step)
        peak = max(peak, maps.tables["f"].idmap.host_bytes())
    assert maps.tables["f"].idmap.used == 1000
    assert peak <= estimate


def test_the_readme_says_the_bytes_a_slot_the_planner_counts() -> None:
    import re

    from shardrec.embeddings.managed.map_memory import id_map_bytes
    from shardrec.embeddings.managed.table_kinds import TableSettings

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    (low, high), *_ = re.findall(r"(\d+)-(\d+) bytes a slot", " ".join(readme.split()))
    # The index's power of two holds 2 to 4 cells a slot: the two ends of the range.
    per_slot = [
        id_map_bytes(TableSettings(kind="managed", rows=rows), 0, 2) / rows
        for rows in (1 << 20, (1 << 20) + 1, 82, 20_000, 3_000_000)
    ]
    assert round(min(per_slot)) == int(low) and round(max(per_slot)) == int(high)
