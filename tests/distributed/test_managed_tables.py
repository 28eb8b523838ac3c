"""Managed tables under every sharding type equal the unsharded module on 1, 2 and 4 ranks.

One model holds two managed tables (lru with a max age, lfu), a hashed one and a static one (a
multi-hot, mean-pooled feature of table rows). Every rank trains 14 steps of a drifting stream of
raw ids (each rank its slice of the global batch) through the id maps, which update every 3
steps: ids are admitted and evicted, reassigned rows start afresh. The reference is the
unsharded EmbeddingBagCollection trained on the whole global batch with the maps of one process.
For each of the six sharding types, every step's rows must be the reference's (the same id ->
row assignment on every rank, at every world size), every map's digest the reference's, every
step's pooled outputs the reference's (this rank's samples), and the trained weights the
reference's (the gradients of every step: under SGD a weight is its initial value less lr times
their sum). Row-wise Adagrad checks the reset of optimizer state where it is plan-independent (no
column cut); the column cuts train with SGD (fbgemm's row-wise Adagrad keeps one accumulator per
column shard: trainer.model.objective).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from shardrec.trainer.distributed.local_ranks import run_local_ranks

TYPES = (
    "table_wise",
    "row_wise",
    "column_wise",
    "table_row_wise",
    "table_column_wise",
    "data_parallel",
)
LOCAL_BATCH = 4
STEPS = 14
DIM = 16
LR = 0.05
EPS = 1e-8
SEED = 3
MISSING = 1 << 63


def _settings():
    from shardrec.embeddings.managed.table_kinds import TableSettings

    return {
        "f0": TableSettings(kind="managed", rows=10, evict_every=3, max_age="5 steps"),
        "f1": TableSettings(kind="managed", rows=8, policy="lfu", admit_after=1, evict_every=3),
        "f2": TableSettings(kind="hashed", rows=9),
    }


def _tables():
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

    rows = {f: s.table_rows for f, s in _settings().items()} | {"f3": 24}
    return [
        EmbeddingBagConfig(
            name=f"t_{f}",
            embedding_dim=DIM,
            num_embeddings=n,
            feature_names=[f],
            pooling=PoolingType.MEAN if f == "f3" else PoolingType.SUM,
        )
        for f, n in rows.items()
    ]


def _stream(world: int):
    """Per step: keys, lengths [features, global batch], values per feature, loss weights."""
    g = np.random.default_rng(11)
    out = []
    batch = LOCAL_BATCH * world
    for step in range(STEPS):
        lengths = g.integers(0, 4, (4, batch))
        values = []
        for f in range(4):
            n = int(lengths[f].sum())
            if f == 3:
                values.append(g.integers(0, 24, n).astype(np.int64))
                continue
            ids = (g.zipf(1.5, n) + step).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15 + f)
            ids[g.random(n) < 0.1] = np.uint64(MISSING)
            values.append(ids.view(np.int64))
        weights = g.standard_normal((4, batch, DIM)).astype(np.float32)
        out.append((lengths, values, weights))
    return out


def _kjt(lengths, values, rows: slice):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    vals, lens = [], []
    for f in range(4):
        starts = np.concatenate([[0], np.cumsum(lengths[f])])
        vals.append(values[f][starts[rows.start] : starts[rows.stop]])
        lens.append(lengths[f][rows])
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{f}" for f in range(4)],
        values=torch.from_numpy(np.concatenate(vals)),
        lengths=torch.from_numpy(np.concatenate(lens)),
    )


def _batch(kjt, n: int):
    from torchrec.datasets.utils import Batch

    return Batch(dense_features=torch.zeros(n, 1), sparse_features=kjt, labels=torch.zeros(n))


def _maps():
    from shardrec.embeddings.managed.maps import build_maps

    maps = build_maps({f: (f"t_{f}", s) for f, s in _settings().items()})
    maps.begin_stretch(0, STEPS)
    return maps


def _reference(world: int, optim: str):
    """The unsharded module on the global batches: every step's rows, the maps, the weights."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from shardrec.trainer.loop.managed_ids import ManagedIds

    tables = _tables()
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    initial = {k: v.clone() for k, v in ebc.state_dict().items()}
    state = {t.name: torch.zeros(t.num_embeddings) for t in tables}
    params = dict(ebc.named_parameters())
    managed = ManagedIds(
        _maps(),
        tables,
        ebc,
        ebc_path="",
        seed=SEED,
        group=None,
        optimizer_states=lambda: (
            None,
            {params[f"embedding_bags.{t}.weight"]: {"m": m} for t, m in state.items()},
        ),
    )
    batches = [
        _batch(_kjt(lengths, values, slice(0, LOCAL_BATCH * world)), LOCAL_BATCH * world)
        for lengths, values, _ in _stream(world)
    ]
    rows, outputs = [], []
    for step, batch in enumerate(managed.train_batches(iter(batches), 0)):
        managed.before_step(step)
        rows.append(batch.sparse_features.values().clone())
        out = ebc(batch.sparse_features)
        outputs.append(torch.stack([out[f"f{f}"].detach().clone() for f in range(4)]))
        weights = _stream(world)[step][2]
        ebc.zero_grad()
        sum((out[f"f{f}"] * torch.from_numpy(weights[f])).sum() for f in range(4)).backward()
        with torch.no_grad():
            for t in tables:
                w = params[f"embedding_bags.{t.name}.weight"]
                g = w.grad / world  # each table receives the mean over ranks
                touched = torch.unique(torch.nonzero(g.abs().sum(1)).flatten())
                if optim == "sgd":
                    w -= LR * g
                else:
                    m = state[t.name]
                    m[touched] += (g[touched] ** 2).mean(1)
                    w[touched] -= LR * g[touched] / (m[touched].sqrt() + EPS)[:, None]
    digests = {f: t.idmap.digest() for f, t in managed.maps.tables.items() if t.idmap is not None}
    weights = {k: v.detach().clone() for k, v in ebc.state_dict().items()}
    return initial, rows, outputs, digests, weights


def _full(state: dict, pg) -> dict[str, torch.Tensor]:
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    out = {}
    for name, t in state.items():
        if isinstance(t, ShardedTensor):
            full = torch.zeros(tuple(t.size()))
            for shard in t.local_shards():
                r, c = shard.metadata.shard_offsets
                h, w = shard.tensor.shape
                full[r : r + h, c : c + w] = shard.tensor
            dist.all_reduce(full, group=pg)
            out[name] = full
        else:
            out[name] = t.detach().clone()
    return out


def _check_type(env, sharding_type: str, reference) -> dict[str, float | bool]:
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import (
        EmbeddingShardingPlanner,
        ParameterConstraints,
        Topology,
    )
    from torchrec.distributed.types import ShardingEnv
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    from shardrec.sharding.torchrec.sharders import build_sharders
    from shardrec.trainer.loop.managed_ids import ManagedIds

    cut = sharding_type in ("column_wise", "table_column_wise")
    optim = "sgd" if cut else "rowwise_adagrad"
    initial, ref_rows, ref_outputs, ref_digests, ref_weights = reference[optim]
    world, rank = env.world_size, env.rank
    tables = _tables()
    kind = EmbOptimType.EXACT_SGD if cut else EmbOptimType.EXACT_ROWWISE_ADAGRAD
    sharders = build_sharders(fused_params={"optimizer": kind, "learning_rate": LR, "eps": EPS})
    kernel = "dense" if sharding_type == "data_parallel" else "fused"
    constraints = {
        t.name: ParameterConstraints(
            sharding_types=[sharding_type], compute_kernels=[kernel], min_partition=8
        )
        for t in tables
    }
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, local_world_size=world, compute_device="cpu"),
        constraints=constraints,
    )
    pg = dist.group.WORLD
    model = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    plan = planner.collective_plan(model, sharders, pg)
    assert {p.sharding_type for p in plan.plan[""].values()} == {sharding_type}
    dmp = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(pg),
        device=env.device,
        plan=plan,
        sharders=sharders,
    )
    for name, t in dmp.state_dict().items():
        for shard in t.local_shards() if isinstance(t, ShardedTensor) else []:
            r, c = shard.metadata.shard_offsets
            h, w = shard.tensor.shape
            shard.tensor.copy_(initial[name][r : r + h, c : c + w])
        if not isinstance(t, ShardedTensor):
            t.copy_(initial[name])
    dp_opt = None
    if sharding_type == "data_parallel":
        params = [p for n, p in dmp.named_parameters() if "embedding_bags" in n]
        dp_opt = RowWiseAdagrad(params, lr=LR, eps=EPS)
    group = dist.new_group(backend="gloo")
    managed = ManagedIds(
        _maps(),
        tables,
        dmp,
        ebc_path="",
        seed=SEED,
        group=group,
        optimizer_states=lambda: (
            dmp.fused_optimizer.state_dict()["state"],
            dp_opt.state if dp_opt is not None else None,
        ),
    )
    mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    stream = _stream(world)
    local = [_batch(_kjt(lengths, values, mine), LOCAL_BATCH) for lengths, values, _ in stream]
    rows_equal, out_err = True, 0.0
    for step, batch in enumerate(managed.train_batches(iter(local), 0)):
        managed.before_step(step)
        ref_local = _kjt(
            stream[step][0], np.split(ref_rows[step].numpy(), _cuts(stream[step][0])), mine
        )
        rows_equal &= bool(torch.equal(batch.sparse_features.values(), ref_local.values()))
        out = dmp(batch.sparse_features)
        pooled = torch.stack([out[f"f{f}"].detach() for f in range(4)])
        out_err = max(out_err, float((pooled - ref_outputs[step][:, mine]).abs().max()))
        weights = stream[step][2]
        sum((out[f"f{f}"] * torch.from_numpy(weights[f][mine])).sum() for f in range(4)).backward()
        if dp_opt is not None:
            dp_opt.step()
            dp_opt.zero_grad()
    after = _full(dmp.state_dict(), pg)
    err = max(float((after[k] - ref_weights[k]).abs().max()) for k in ref_weights)
    digests = {f: t.idmap.digest() for f, t in managed.maps.tables.items() if t.idmap is not None}
    reassigned = sum(managed.counts.admitted.values())
    return {
        "rows_equal": rows_equal,
        "maps_equal": digests == ref_digests,
        "output_err": out_err,
        "weight_err": err,
        "reassigned": reassigned,
    }


def _cuts(lengths) -> list[int]:
    """Where the global values split into features."""
    return list(np.cumsum(lengths.sum(axis=1))[:-1])


def _check_all(env) -> dict[str, dict]:
    reference = {o: _reference(env.world_size, o) for o in ("sgd", "rowwise_adagrad")}
    return {st: _check_type(env, st, reference) for st in TYPES}


def _assert_equal(results: list) -> None:
    for rank, per_type in enumerate(results):
        assert set(per_type) == set(TYPES)
        for st, r in per_type.items():
            assert r["rows_equal"], f"rank {rank} {st}: rows differ from the unsharded maps'"
            assert r["maps_equal"], f"rank {rank} {st}: id maps differ from the unsharded run's"
            assert r["output_err"] <= 1e-5, f"rank {rank} {st}: outputs differ by {r['output_err']}"
            assert r["weight_err"] <= 1e-5, f"rank {rank} {st}: weights differ by {r['weight_err']}"
            assert r["reassigned"] >= 10, f"rank {rank} {st}: only {r['reassigned']} admissions"


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_managed_tables_equal_unsharded_under_every_sharding_type(world_size: int) -> None:
    _assert_equal(run_local_ranks(_check_all, world_size, timeout_s=600))
