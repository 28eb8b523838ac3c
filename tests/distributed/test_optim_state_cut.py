"""Resuming row-wise Adagrad state across a changed column cut, on 2 gloo ranks: the table was
cut over ranks 0 and 1 and is now whole on rank 0 only. Rank 1 holds none of it and must still
join DCP's load (a collective), or rank 0 waits until the collective timeout."""

from __future__ import annotations

from pathlib import Path

import torch

from shardrec.trainer.distributed.local_ranks import run_local_ranks

ROWS = 6


def _plans():
    from torchrec.modules.embedding_configs import EmbeddingBagConfig

    from shardrec.sharding.plan.plan_file import plan_fingerprint
    from shardrec.sharding.plan.plan_types import PLAN_SCHEMA_VERSION, PlanFile, Shard, TablePlan

    config = EmbeddingBagConfig(
        name="t_a", embedding_dim=8, num_embeddings=ROWS, feature_names=["a"]
    )

    def plan(shards: list) -> PlanFile:
        fingerprint = plan_fingerprint([config], 2, 64, "cpu")
        return PlanFile(PLAN_SCHEMA_VERSION, fingerprint, [TablePlan("t_a", "x", "fused", shards)])

    return plan([Shard(0, 0, 0, ROWS, 4), Shard(1, 0, 4, ROWS, 4)]), plan([Shard(0, 0, 0, ROWS, 8)])


def _resume_on_the_new_cut(env, directory: str) -> list[float] | None:
    from datetime import timedelta

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from shardrec.trainer.rundir.optim_state import adapt_fused_state

    saved, plan = _plans()
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=20))
    key, name = "sparse.t_a.weight", "t_a.momentum1"
    old = torch.arange(2 * ROWS, dtype=torch.float32)  # [2 column shards x rows], replicated
    dcp.save(
        {"fused_optim": {"state": {key: {name: old}}}}, checkpoint_id=directory, process_group=group
    )
    # Rank 0 holds the whole table now; rank 1 holds nothing of it.
    state = {"state": {key: {name: torch.zeros(ROWS)}}} if env.rank == 0 else {"state": {}}
    converted = adapt_fused_state(Path(directory), state, saved.to_json(), plan, group)
    return converted[key][name].tolist() if converted else None


def test_every_rank_joins_the_load_of_a_table_that_now_lives_on_one_rank(tmp_path: Path) -> None:
    from shardrec.trainer.rundir.optim_state import convert_rowwise_momentum

    # A rank left waiting in a collective fails after 20 s (RankFailed) instead of hanging the test.
    on_rank0, on_rank1 = run_local_ranks(
        _resume_on_the_new_cut, 2, str(tmp_path), collective_timeout_s=20
    )
    expected = convert_rowwise_momentum(
        torch.arange(2 * ROWS, dtype=torch.float32), ROWS, [4, 4], [8]
    )
    assert on_rank0 == expected.tolist() and on_rank1 is None
