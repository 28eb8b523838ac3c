"""Tables and plans for the planner's tests: n tables of growing rows, planned by shardrec's planner
(or torchrec's search) for a CPU job."""

from __future__ import annotations

from torchrec.modules.embedding_configs import EmbeddingBagConfig

from shardrec.sharding.planner import plan_tables
from shardrec.sharding.search.request import PlanRequest


def make_tables(n: int = 4, dim: int = 16) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            name=f"t_f{i}", embedding_dim=dim, num_embeddings=100 * (i + 1), feature_names=[f"f{i}"]
        )
        for i in range(n)
    ]


def make_plan(configs, world_size=2, batch=64, constraints=None, search="shardrec", **kw):
    return plan_tables(
        PlanRequest(
            configs=configs,
            world_size=world_size,
            local_world_size=world_size,
            global_batch_size=batch,
            device_kind="cpu",
            constraints=constraints,
            **kw,
        ),
        search=search,
    )
