"""Every sharding type runs on CPU/gloo (and on CUDA/NCCL, `pytest -m gpu`) and equals the
unsharded module.

For each of the six types, an EmbeddingBagCollection sharded by DistributedModelParallel over
2 ranks gets the same global batch (each rank its half) and must return the unsharded
module's pooled embeddings (of sum-pooled tables and a mean-pooled one), and produce the same
gradients. On CUDA the same check runs on one GPU (fbgemm's CUDA kernels) and, given 2 GPUs,
over NCCL's all-to-all.

The gradient semantics are pinned down here because the trainer relies on them: every table
receives the MEAN over ranks of each rank's loss gradient. Data-parallel tables go through DDP,
which averages; sharded tables go through the all-to-all backward, which adds every rank's
contribution and then divides by the world size (torchrec's comm_ops gradient division, on by
default). So with a per-rank mean loss, every parameter sees the gradient of the global mean.
"""

from __future__ import annotations

import pytest
import torch

from shardrec.trainer.distributed.local_ranks import run_local_ranks

WORLD_SIZE = 2
LOCAL_BATCH = 4
TYPES = (
    "table_wise",
    "row_wise",
    "column_wise",
    "table_row_wise",
    "table_column_wise",
    "data_parallel",
)


def _tables():
    """Three sum-pooled tables and a mean-pooled one (a spec's list column with pooling = "mean"):
    row-wise shards must divide the summed partial bags by the whole bag's length."""
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

    return [
        EmbeddingBagConfig(
            name=f"t{i}",
            embedding_dim=16,
            num_embeddings=rows,
            feature_names=[f"f{i}"],
            pooling=pool,
        )
        for i, (rows, pool) in enumerate(
            (
                (40, PoolingType.SUM),
                (23, PoolingType.SUM),
                (64, PoolingType.SUM),
                (48, PoolingType.MEAN),
            )
        )
    ]


def _global_batch(tables, batch: int, seed: int = 1):
    """A multi-hot KJT (0-3 ids per row, some bags empty) and per-row loss weights."""

    g = torch.Generator().manual_seed(seed)
    lengths, values = [], []
    for t in tables:
        n = torch.randint(0, 4, (batch,), generator=g)
        lengths.append(n)
        values.append(torch.randint(0, t.num_embeddings, (int(n.sum()),), generator=g))
    keys = [t.feature_names[0] for t in tables]
    weights = {k: torch.randn(batch, 16, generator=g) for k in keys}
    return keys, torch.stack(lengths), values, weights


def _kjt(keys, lengths, values, rows: slice):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    vals, lens = [], []
    for i, _ in enumerate(keys):
        starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths[i].cumsum(0)])
        vals.append(values[i][starts[rows.start] : starts[rows.stop]])
        lens.append(lengths[i][rows])
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.cat(vals), lengths=torch.cat(lens)
    )


def _full_weights(state: dict, pg, device: torch.device) -> dict[str, torch.Tensor]:
    """Each table's whole weight on every rank, assembled from the local shards."""
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    out = {}
    for name, t in state.items():
        if isinstance(t, ShardedTensor):
            full = torch.zeros(tuple(t.size()), device=device)
            for shard in t.local_shards():
                r, c = shard.metadata.shard_offsets
                h, w = shard.tensor.shape
                full[r : r + h, c : c + w] = shard.tensor
            dist.all_reduce(full, group=pg)
            out[name] = full.cpu()
        else:
            out[name] = t.detach().cpu()
    return out


def _check_type(env, sharding_type: str, tables=None) -> dict[str, float]:
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import (
        EmbeddingShardingPlanner,
        ParameterConstraints,
        Topology,
    )
    from torchrec.distributed.types import ShardingEnv
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from shardrec.sharding.torchrec.sharders import build_sharders

    tables = tables or _tables()
    torch.manual_seed(0)
    reference = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    keys, lengths, values, weights = _global_batch(tables, LOCAL_BATCH * env.world_size)
    mine = slice(env.rank * LOCAL_BATCH, (env.rank + 1) * LOCAL_BATCH)

    # Reference: the unsharded module on the whole global batch; loss = sum over every rank's rows.
    ref_out = reference(_kjt(keys, lengths, values, slice(0, LOCAL_BATCH * env.world_size)))
    sum((ref_out[k] * weights[k]).sum() for k in keys).backward()

    # Fused SGD with lr 1 in backward: a sharded table's weight change is minus its gradient.
    sharders = build_sharders(
        fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 1.0}
    )
    kernel = "dense" if sharding_type == "data_parallel" else "fused"
    constraints = {
        t.name: ParameterConstraints(
            sharding_types=[sharding_type], compute_kernels=[kernel], min_partition=8
        )
        for t in tables
    }
    planner = EmbeddingShardingPlanner(
        topology=Topology(
            world_size=env.world_size,
            local_world_size=env.world_size,
            compute_device=env.device.type,
        ),
        constraints=constraints,
    )
    pg = dist.group.WORLD
    model = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    plan = planner.collective_plan(model, sharders, pg)
    types = {p.sharding_type for p in plan.plan[""].values()}
    assert types == {sharding_type}, f"planned {types} for {sharding_type}"
    dmp = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(pg),
        device=env.device,
        plan=plan,
        sharders=sharders,
    )
    ref_state = reference.state_dict()
    for name, t in dmp.state_dict().items():
        from torch.distributed._shard.sharded_tensor import ShardedTensor

        for shard in t.local_shards() if isinstance(t, ShardedTensor) else []:
            r, c = shard.metadata.shard_offsets
            h, w = shard.tensor.shape
            shard.tensor.copy_(ref_state[name][r : r + h, c : c + w])
        if not isinstance(t, ShardedTensor):
            t.copy_(ref_state[name])

    out = dmp(_kjt(keys, lengths, values, mine).to(env.device))
    out_err = max(float((out[k].cpu() - ref_out[k][mine]).detach().abs().max()) for k in keys)
    sum((out[k] * weights[k][mine].to(env.device)).sum() for k in keys).backward()
    with torch.no_grad():  # data-parallel tables are dense parameters: the same SGD step by hand
        for p in dmp.parameters():
            if p.grad is not None:
                p.sub_(p.grad)
    after = _full_weights(dmp.state_dict(), pg, env.device)
    grad_err = 0.0
    for name, ref_w in ref_state.items():
        ref_grad = dict(reference.named_parameters())[name].grad
        # The reference loss sums over every rank's rows; each table gets the mean over ranks.
        grad = ref_w - after[name]
        # Relative to the gradient's scale where it exceeds 1: with a mean-pooled table, torchrec's
        # row-wise path divides every pooled bag by its length after the all-to-all (its
        # mean-pooling callback), which reorders fp32 sums: gradients near 4 then differ by a few
        # units in the last place (~2e-6).
        scale = max(1.0, float(ref_grad.abs().max()))
        grad_err = max(grad_err, float((grad - ref_grad / env.world_size).abs().max()) / scale)
    return {"out_err": out_err, "grad_err": grad_err}


def _check_all(env) -> dict[str, dict[str, float]]:
    return {st: _check_type(env, st) for st in TYPES}


@pytest.mark.slow
def test_every_sharding_type_equals_unsharded():
    _assert_all_equal_unsharded(run_local_ranks(_check_all, WORLD_SIZE), 1e-6)


def _rowless_tables():
    """One-row tables, sum- and mean-pooled: row-wise blocks of ceil(1 / 2) = 1 row leave rank 1
    no rows of either, and so a table batch without weights there."""
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

    return [
        EmbeddingBagConfig(
            name=f"t{i}", embedding_dim=16, num_embeddings=1, feature_names=[f"f{i}"], pooling=pool
        )
        for i, pool in enumerate((PoolingType.SUM, PoolingType.MEAN))
    ]


def _check_rowless(env) -> dict[str, dict[str, float]]:
    return {st: _check_type(env, st, _rowless_tables()) for st in ("row_wise", "table_row_wise")}


@pytest.mark.slow
def test_a_rank_that_row_wise_tables_leave_without_rows_trains_as_unsharded():
    """fbgemm's CPU kernel took a table batch without weights for a CUDA one ("weights[0] must be
    a GPU or MTIA tensor") and the rank died at its first lookup (sharding/torchrec/
    empty_shards_cpu.py)."""
    results = run_local_ranks(_check_rowless, WORLD_SIZE)
    # One row of bound 1 pools to values near 3, whose fp32 sums after the pooled output's
    # reduce-scatter differ from the unsharded ones by ~1e-6 (as any row-wise table's do, in
    # proportion to its values).
    for rank, per_type in enumerate(results):
        for st, err in per_type.items():
            assert err["out_err"] <= 1e-5 and err["grad_err"] <= 1e-6, (rank, st, err)


def _assert_all_equal_unsharded(results: list, tolerance: float) -> None:
    for rank, per_type in enumerate(results):
        assert set(per_type) == set(TYPES)
        for st, err in per_type.items():
            assert err["out_err"] <= tolerance, (
                f"rank {rank} {st}: pooled outputs differ by {err['out_err']}"
            )
            assert err["grad_err"] <= tolerance, (
                f"rank {rank} {st}: gradients differ by {err['grad_err']}"
            )


# fbgemm's CUDA kernels sum in another order than the CPU reference: fp32 rounding, not 1e-6.
CUDA_TOLERANCE = 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_every_sharding_type_equals_unsharded_on_one_gpu():
    _assert_all_equal_unsharded(run_local_ranks(_check_all, 1, device_kind="cuda"), CUDA_TOLERANCE)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.skipif(0 < torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_every_sharding_type_equals_unsharded_over_nccl_on_two_gpus():
    _assert_all_equal_unsharded(run_local_ranks(_check_all, 2, device_kind="cuda"), CUDA_TOLERANCE)
