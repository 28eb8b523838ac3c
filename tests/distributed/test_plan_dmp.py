"""A plan file round-trips into a ShardingPlan that DistributedModelParallel accepts on gloo.

The parent plans (with constraints pinning table-wise, row-wise, column-wise,
table-row-wise, table-column-wise and data-parallel tables) and saves the file; each rank
loads it, checks its fingerprint, shards an EmbeddingBagCollection with DMP and must return
the unsharded module's pooled embeddings for its half of the global batch.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shardrec.trainer.distributed.local_ranks import run_local_ranks

WORLD_SIZE = 2
GLOBAL_BATCH = 8
PINNED = {
    "t0": "table_wise",
    "t1": "row_wise",
    "t2": "column_wise",
    "t3": "table_row_wise",
    "t4": "table_column_wise",
    "t5": "data_parallel",
}


def _tables():
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    rows = (40, 23, 64, 17, 30, 9, 50)
    return [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=16, num_embeddings=n, feature_names=[f"f{i}"]
        )
        for i, n in enumerate(rows)
    ]


def _global_input(tables, seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    lengths = [torch.randint(0, 4, (GLOBAL_BATCH,), generator=g) for _ in tables]
    values = [
        torch.randint(0, t.num_embeddings, (int(n.sum()),), generator=g)
        for t, n in zip(tables, lengths)
    ]
    return lengths, values


def _kjt(tables, lengths, values, lo: int, hi: int):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    vals, lens = [], []
    for n, v in zip(lengths, values):
        starts = torch.cat([torch.zeros(1, dtype=torch.long), n.cumsum(0)])
        vals.append(v[starts[lo] : starts[hi]])
        lens.append(n[lo:hi])
    keys = [t.feature_names[0] for t in tables]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.cat(vals), lengths=torch.cat(lens)
    )


def _worker(env, plan_path: str) -> dict:
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from shardrec.sharding.plan.plan_file import check_plan, load_plan, plan_fingerprint
    from shardrec.sharding.torchrec.sharders import build_sharders
    from shardrec.sharding.torchrec.torchrec_plans import to_sharding_plan

    tables = _tables()
    plan = load_plan(plan_path)
    check_plan(plan, plan_fingerprint(tables, env.world_size, GLOBAL_BATCH, "cpu"))
    sharding_plan = to_sharding_plan(plan, tables, "", env.world_size, env.local_world_size, "cpu")
    torch.manual_seed(0)
    reference = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    full = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    model = DistributedModelParallel(
        EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
        device=torch.device("cpu"),
        plan=sharding_plan,
        sharders=build_sharders(),
    )
    with torch.no_grad():
        for key, value in model.state_dict().items():
            src = full[key.removeprefix("module.")]
            if isinstance(value, ShardedTensor):
                for shard in value.local_shards():
                    r, c = shard.metadata.shard_offsets
                    h, w = shard.tensor.shape
                    shard.tensor.copy_(src[r : r + h, c : c + w])
            else:
                value.copy_(src)
    lengths, values = _global_input(tables)
    local = GLOBAL_BATCH // env.world_size
    lo, hi = env.rank * local, (env.rank + 1) * local
    got = model(_kjt(tables, lengths, values, lo, hi))
    got = got.wait() if hasattr(got, "wait") else got
    want = reference(_kjt(tables, lengths, values, 0, GLOBAL_BATCH))
    diffs = {}
    for t in tables:
        key = t.feature_names[0]
        diffs[t.name] = float((got[key] - want[key][lo:hi]).abs().max())
    types = {name: ps.sharding_type for name, ps in sharding_plan.plan[""].items()}
    return {"diffs": diffs, "types": types}


@pytest.mark.parametrize("listed", ["in-order", "reversed"])
def test_plan_file_shards_ebc_like_unsharded(tmp_path: Path, listed: str) -> None:
    """`reversed`: each table's shards listed last first in the file (the same ranks, rows and
    columns); a row-wise table so listed looked its ids up in the other rank's rows."""
    import dataclasses

    from shardrec.sharding.plan.plan_file import save_plan
    from shardrec.sharding.planner import plan_tables
    from shardrec.sharding.search.request import PlanRequest

    tables = _tables()
    constraints = {f"t{i}": {"sharding_types": [st]} for i, st in enumerate(PINNED.values())}
    constraints["t2"]["min_partition"] = 8
    constraints["t4"]["min_partition"] = 8
    plan = plan_tables(
        PlanRequest(
            configs=tables,
            world_size=WORLD_SIZE,
            local_world_size=WORLD_SIZE,
            global_batch_size=GLOBAL_BATCH,
            device_kind="cpu",
            constraints=constraints,
        )
    )
    if listed == "reversed":
        plan.tables = [dataclasses.replace(t, shards=t.shards[::-1]) for t in plan.tables]
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    results = run_local_ranks(_worker, WORLD_SIZE, str(path))
    for rank, res in enumerate(results):
        for name, st in PINNED.items():
            assert res["types"][name] == st
        for name, diff in res["diffs"].items():
            assert diff < 1e-5, (
                f"rank {rank} table {name}: sharded output differs from unsharded by {diff}"
            )
