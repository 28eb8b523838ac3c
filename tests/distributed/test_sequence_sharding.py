"""A sequence model's unpooled tables (torchrec's EmbeddingCollection) sharded every way torchrec
builds them equal the unsharded module, on 1, 2 and 4 ranks, with and without dedup; pooled bags
and unpooled sequences shard together under one DistributedModelParallel.

Two spawned groups (a rank imports torchrec in seconds), of 2 ranks (also checking 1, on a group
of rank 0) and of 4, each build one model per world size whose four sequence tables take the four
types (data-parallel, table-, row-, column-wise). The sharded module gets each rank's slice of one global batch
of histories (0-6 ids, some empty, repeated ids) and candidates (one id, reading the history's
table), and must return the unsharded module's rows and, after one step of SGD at rate 1 (fused
in backward; by hand on the DDP-averaged gradient of data-parallel tables), its weights: every
table sees the mean over ranks of each rank's loss gradient, as for bags (test_sharding_types.py).
"""

from __future__ import annotations

import pytest
import torch

from shardrec.trainer.distributed.local_ranks import run_local_ranks

WORLD_SIZE = 4
LOCAL_BATCH = 3
DIM = 16
SEQUENCE_TYPES = ("table_wise", "row_wise", "column_wise", "data_parallel")


def _tables():
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType

    def table(name, rows, features, pooling):
        return EmbeddingBagConfig(
            name=name,
            embedding_dim=DIM,
            num_embeddings=rows,
            feature_names=features,
            pooling=pooling,
        )

    bags = [
        table("t_uid", 37, ["uid"], PoolingType.SUM),
        table("t_genres", 29, ["genres"], PoolingType.MEAN),
    ]
    sequences = [
        table("t_item", 50, ["hist_item", "cand_item"], PoolingType.NONE),
        table("t_artist", 23, ["hist_artist", "cand_artist"], PoolingType.NONE),
        table("t_album", 31, ["hist_album"], PoolingType.NONE),
        table("t_action", 8, ["hist_action"], PoolingType.NONE),
    ]
    return bags, sequences


def _global_batch(batch: int, seed: int = 1):
    """feature -> (lengths, ids) of the global batch, and per-feature loss weights."""
    g = torch.Generator().manual_seed(seed)
    hist = torch.randint(0, 7, (batch,), generator=g)
    hist[0] = 0  # an empty history
    genres = torch.randint(0, 4, (batch,), generator=g)
    ones = torch.ones(batch, dtype=torch.long)
    feats = {
        "uid": (ones, torch.randint(0, 37, (batch,), generator=g)),
        "genres": (genres, torch.randint(0, 29, (int(genres.sum()),), generator=g)),
        "hist_item": (hist, torch.randint(0, 50, (int(hist.sum()),), generator=g)),
        "cand_item": (ones, torch.randint(0, 50, (batch,), generator=g)),
        "hist_artist": (hist, torch.randint(0, 23, (int(hist.sum()),), generator=g)),
        "cand_artist": (ones, torch.randint(0, 23, (batch,), generator=g)),
        "hist_album": (hist, torch.randint(0, 31, (int(hist.sum()),), generator=g)),
        "hist_action": (hist, torch.randint(0, 8, (int(hist.sum()),), generator=g)),
    }
    feats["hist_item"][1][:3] = 7  # repeated ids, and the candidate among them
    feats["cand_item"][1][:2] = 7
    weights = {
        k: torch.randn(int(lengths.sum()), DIM, generator=g) for k, (lengths, _) in feats.items()
    }
    return feats, weights


def _rows(lengths: torch.Tensor, rows: slice) -> slice:
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    return slice(int(starts[rows.start]), int(starts[rows.stop]))


def _kjt(feats, rows: slice):
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    keys = list(feats)
    values = [ids[_rows(lengths, rows)] for lengths, ids in feats.values()]
    lengths = [lengths[rows] for lengths, _ in feats.values()]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.cat(values), lengths=torch.cat(lengths)
    )


def _loss(pooled, unpooled, feats, weights, rows: slice):
    """Sum of outputs times fixed weights: per id for sequences, per sample for bags (its rows of
    the per-id weights' first ones, one per sample)."""
    total = torch.zeros(())
    for name, jagged in unpooled.items():
        total = total + (jagged.values * weights[name][_rows(feats[name][0], rows)]).sum()
    for out in pooled.values():
        total = total + (out * weights["uid"][rows]).sum()
    return total


def _full_weights(state: dict, pg) -> dict[str, torch.Tensor]:
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


def _check(pg, rank: int, world_size: int, types: dict[str, str]) -> dict[str, float]:
    """One sharded model against the unsharded one, each table sharded as `types` says (bags
    only where it names them); both lookups, plain and deduplicated, checked and stepped."""
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

    from shardrec.embeddings.tables import build_ebc, build_ec
    from shardrec.sharding.torchrec.sharders import build_sharders
    from shardrec.trainer.model.sequence_arch import SequenceSparseArch

    bags, sequences = _tables()
    bags = [t for t in bags if t.name in types]

    def arch(device: str, dedup: bool = False) -> SequenceSparseArch:
        return SequenceSparseArch(
            build_ebc(bags, device) if bags else None, build_ec(sequences, device), dedup=dedup
        )

    torch.manual_seed(0)
    reference = arch("cpu")
    batch = LOCAL_BATCH * world_size
    feats, weights = _global_batch(batch)
    mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    everything = slice(0, batch)
    pooled, unpooled = reference(_kjt(feats, everything))
    _loss(pooled, unpooled, feats, weights, everything).backward()
    ref_state = {k: v.detach().clone() for k, v in reference.state_dict().items()}
    ref_grads = {k: p.grad.clone() for k, p in reference.named_parameters()}

    constraints = {
        name: ParameterConstraints(
            sharding_types=[st],
            compute_kernels=["dense" if st == "data_parallel" else "fused"],
            min_partition=8,
        )
        for name, st in types.items()
    }
    sharders = build_sharders(
        fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 1.0}
    )
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world_size, local_world_size=world_size, compute_device="cpu"),
        constraints=constraints,
    )
    model = arch("meta")
    plan = planner.collective_plan(model, sharders, pg)
    planned = {n: p.sharding_type for module in plan.plan.values() for n, p in module.items()}
    assert planned == types, f"planned {planned}, asked {types}"
    dmp = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(pg),
        device=torch.device("cpu"),
        plan=plan,
        sharders=sharders,
    )
    for name, t in dmp.state_dict().items():
        for shard in t.local_shards() if isinstance(t, ShardedTensor) else []:
            r, c = shard.metadata.shard_offsets
            h, w = shard.tensor.shape
            shard.tensor.copy_(ref_state[name][r : r + h, c : c + w])
        if not isinstance(t, ShardedTensor):
            t.copy_(ref_state[name])

    out_err, loss = 0.0, torch.zeros(())
    for dedup in (False, True):
        dmp.module.dedup = dedup
        got_pooled, got_unpooled = dmp(_kjt(feats, mine))
        for name, jagged in got_unpooled.items():
            expect = unpooled[name].values[_rows(feats[name][0], mine)]
            assert torch.equal(jagged.lengths, feats[name][0][mine])
            if expect.numel():
                out_err = max(out_err, float((jagged.values - expect).detach().abs().max()))
        for name, out in got_pooled.items():
            out_err = max(out_err, float((out - pooled[name][mine]).detach().abs().max()))
        loss = loss + _loss(got_pooled, got_unpooled, feats, weights, mine)
    loss.backward()
    with torch.no_grad():  # data-parallel tables: DDP averaged their gradients; step by hand
        for p in dmp.parameters():
            if p.grad is not None:
                p.sub_(p.grad)
    after = _full_weights(dmp.state_dict(), pg)
    grad_err = 0.0
    for name, before in ref_state.items():
        # Two lookups (plain and deduplicated) each gave the mean over ranks of the gradient.
        expect = before - 2 * ref_grads[name] / world_size
        scale = max(1.0, float(expect.abs().max()))  # fp32 sums in another order
        grad_err = max(grad_err, float((after[name] - expect).abs().max()) / scale)
    dist.barrier(group=pg)
    return {"out_err": out_err, "grad_err": grad_err}


def _warmup_rates(pg) -> list[tuple[float, bool]]:
    """A warm-up from 0 (DLRMv4's) reaches the fused row-wise Adagrad inside fbgemm's kernel: per
    step, the kernel's learning rate and whether the step changed the table."""
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import (
        EmbeddingShardingPlanner,
        ParameterConstraints,
        Topology,
    )
    from torchrec.distributed.types import ShardingEnv

    from shardrec.embeddings.table_batches import table_batches
    from shardrec.embeddings.tables import build_ec
    from shardrec.sharding.torchrec.sharders import build_sharders
    from shardrec.trainer.model.sequence_arch import SequenceSparseArch
    from shardrec.trainer.model.train_optimizer import TrainOptimizer, dlrm_schedule

    _, sequences = _tables()
    world_size = pg.size()
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1, "eps": 1e-8}
    sharders = build_sharders(fused_params=fused)
    constraints = {
        t.name: ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"])
        for t in sequences
    }
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world_size, local_world_size=world_size, compute_device="cpu"),
        constraints=constraints,
    )
    model = SequenceSparseArch(None, build_ec(sequences, "meta"))
    plan = planner.collective_plan(model, sharders, pg)
    dmp = DistributedModelParallel(
        model,
        env=ShardingEnv.from_process_group(pg),
        device=torch.device("cpu"),
        plan=plan,
        sharders=sharders,
    )
    dense = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    schedule = dlrm_schedule(2, 0, 0, from_zero=True)
    optimizer = TrainOptimizer(dense, None, {}, schedule, dmp.fused_optimizer)
    kernels = table_batches(dmp.fused_optimizer)
    feats, weights = _global_batch(3 * world_size)
    mine = slice(pg.rank() * 3, (pg.rank() + 1) * 3)
    seen = []
    for _ in range(3):
        optimizer.zero_grad()  # sets this step's rate, before the backward that applies it
        before = [
            p.detach().clone() for p in dmp.state_dict().values() if hasattr(p, "local_shards")
        ]
        _, unpooled = dmp(_kjt(feats, mine))
        _loss({}, unpooled, feats, weights, mine).backward()
        optimizer.step()
        after = [
            p.detach().clone() for p in dmp.state_dict().values() if hasattr(p, "local_shards")
        ]
        changed = any(
            not torch.equal(a.local_shards()[0].tensor, b.local_shards()[0].tensor)
            for a, b in zip(before, after)
            if a.local_shards()
        )
        rate = round(kernels[0].get_learning_rate(), 6) if kernels else None
        seen.append((rate, changed))
    # A rank the plan gave no table has no kernel: the ranks' views together.
    views: list = [None] * world_size
    dist.all_gather_object(views, seen)
    return [
        (next(r for r, _ in step if r is not None), any(c for _, c in step)) for step in zip(*views)
    ]


def _check_all(env, world_sizes: tuple[int, ...]) -> dict[int, dict]:
    """One model per world size whose four sequence tables take the four types (rotated by world
    size, so the table two features share is cut a different way each time), with bags beside
    them on 2 and 4 ranks. A smaller world size runs on a group of the first ranks (torchrec
    places shards by global rank); a group of 2 inside 4 ranks hangs in torchrec's set-up, so 1
    and 2 ranks run in a world of 2."""
    import torch.distributed as dist

    bags, sequences = _tables()
    results = {}
    for world_size in world_sizes:
        pg = (
            dist.group.WORLD
            if world_size == env.world_size
            else dist.new_group(list(range(world_size)))
        )
        turn = {1: 0, 2: 1, 4: 2}[world_size]
        types = {
            t.name: SEQUENCE_TYPES[(i + turn) % len(SEQUENCE_TYPES)]
            for i, t in enumerate(sequences)
        }
        if world_size > 1:
            types |= {bags[0].name: "row_wise", bags[1].name: "table_wise"}
        if env.rank < world_size:
            results[world_size] = {"types": types, **_check(pg, env.rank, world_size, types)}
            if world_size == 2:
                results["warmup"] = _warmup_rates(pg)
        dist.barrier()  # the others wait here
    return results


@pytest.mark.slow
def test_sequence_tables_of_every_type_equal_unsharded_on_1_2_and_4_ranks():
    results = run_local_ranks(_check_all, 2, (1, 2)) + run_local_ranks(_check_all, WORLD_SIZE, (4,))
    # Step 0 at rate 0 leaves the tables as they were; then lr / 2, lr.
    assert (
        results[0].pop("warmup")
        == results[1].pop("warmup")
        == [
            (0.0, False),
            (0.05, True),
            (0.1, True),
        ]
    )
    assert [sorted(r) for r in results] == [[1, 2], [2], [4], [4], [4], [4]]
    item_types = set()
    for checks in results:
        for world_size, err in checks.items():
            assert set(err["types"].values()) >= set(SEQUENCE_TYPES)
            item_types.add(err["types"]["t_item"])
            where = f"{world_size} ranks, {err['types']}"
            assert err["out_err"] <= 1e-6, f"{where}: rows differ by {err['out_err']}"
            assert err["grad_err"] <= 1e-6, f"{where}: updates differ by {err['grad_err']}"
    assert len(item_types) == 3  # the shared table, three ways
