"""A plan's layout is checked where ranks build it, not only where `shardrec train` starts them:
ranks that torchrun starts directly (`torchrun ... -m shardrec.trainer --plan FILE`) trained a
row-wise table whose two shards were swapped between the ranks (rows 0..500 on rank 1, 500..1000
on rank 0), exit 0, though `shardrec train` refuses that file (tests/robustness/test_plan_files.py).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding.plan.plan_types import Shard
from shardrec.sharding.planner import plan_tables
from shardrec.sharding.search.request import PlanRequest
from shardrec.trainer.distributed.dist import DistEnv
from shardrec.trainer.model import run_plan

BATCH = 64


def test_ranks_started_by_torchrun_refuse_a_row_wise_table_on_swapped_ranks() -> None:
    tables = [
        EmbeddingBagConfig(name=f"t_f{i}", embedding_dim=16, num_embeddings=1000, feature_names=[f"f{i}"])
        for i in range(2)
    ]  # fmt: skip
    plan = plan_tables(
        PlanRequest(
            configs=tables,
            world_size=2,
            local_world_size=2,
            global_batch_size=BATCH,
            device_kind="cpu",
            constraints={"t_f0": {"sharding_types": ["row_wise"]}},
        )
    )
    env = DistEnv(0, 0, 2, 2, torch.device("cpu"), "gloo")
    run_plan.build_sharding_plan(plan, tables, env, BATCH)  # as planned: built
    t = plan.table("t_f0")
    assert [(s.rank, s.row_offset, s.rows) for s in t.shards] == [(0, 0, 500), (1, 500, 500)]
    swapped = dataclasses.replace(t, shards=[Shard(1, 0, 0, 500, 16), Shard(0, 500, 0, 500, 16)])
    edited = dataclasses.replace(plan, tables=[swapped, plan.table("t_f1")])
    with pytest.raises(ValueError) as caught:
        run_plan.build_sharding_plan(edited, tables, env, BATCH)
    assert str(caught.value) == (
        "table t_f0: its shards (rank 0: rows 500..1000, columns 0..16) are not a row_wise layout "
        "of its 1000 x 16 weights on 2 ranks (was the plan edited? re-run `shardrec plan`)"
    )
