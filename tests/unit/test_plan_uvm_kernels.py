"""Tables in host memory (fused_uvm, fused_uvm_caching): the trainer shards them on CUDA with each
cached table's own cache (its load factor from the plan, its own fbgemm TBE), and refuses them on
CPU in one line. No GPU here: what torchrec receives is checked, and torchrec's own grouping of
tables into TBEs is run on it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from helpers import assert_one_line_error
from torchrec.distributed.embedding_sharding import group_tables
from torchrec.distributed.embedding_types import EmbeddingComputeKernel, ShardedEmbeddingTable
from torchrec.distributed.utils import add_params_from_parameter_sharding, convert_to_fbgemm_types
from typer.testing import CliRunner

from shardrec.dataloader.format.manifest import Manifest
from shardrec.embeddings.tables import build_table_configs
from shardrec.sharding.plan.plan_file import plan_fingerprint, save_plan
from shardrec.sharding.plan.plan_types import (
    PLAN_SCHEMA_VERSION,
    CachePlan,
    PlanFile,
    Shard,
    TablePlan,
)
from shardrec.sharding.torchrec.torchrec_plans import to_sharding_plan
from shardrec.tools.cli.app import app
from shardrec.trainer.distributed.dist import DistEnv
from shardrec.trainer.job.config import JobConfig
from shardrec.trainer.model import build, run_plan, train_module
from shardrec.trainer.model.objective import TRAIN_EBC_PATH

BATCH = 64
KERNELS = {
    "t_f0": ("fused_uvm_caching", 0.2),
    "t_f1": ("fused_uvm_caching", 0.5),
    "t_f3": ("fused_uvm", 0.0),
}
"""Tables of tiny_dataset (t_f0..t_f3) off the plain fused kernel; t_f2 stays fused."""


def _uvm_plan(
    dataset: Path, kernels: dict[str, tuple[str, float]] = KERNELS
) -> tuple[PlanFile, list]:
    """Every table whole on rank 0 of one CUDA rank, on the kernels `kernels` names."""
    tables = build_table_configs(Manifest.load(dataset), JobConfig().model.embedding_dim)
    placed = []
    for t in tables:
        kernel, load_factor = kernels.get(t.name, ("fused", 0.0))
        rows = int(t.num_embeddings)
        cache = (
            CachePlan(load_factor, [max(1, int(rows * load_factor))], [0.5])
            if load_factor
            else None
        )
        placed.append(
            TablePlan(t.name, "table_wise", kernel, [Shard(0, 0, 0, rows, t.embedding_dim)], cache)
        )
    return PlanFile(
        PLAN_SCHEMA_VERSION, plan_fingerprint(tables, 1, BATCH, "cuda"), placed, planner="test"
    ), tables


def _tbes(plan: PlanFile, tables: list) -> list[tuple[list[str], float | None]]:
    """The fbgemm TBEs torchrec makes of the plan's tables on rank 0, as (tables, cache load factor):
    each table's fused params merged as torchrec's sharder merges them, then torchrec's grouping."""
    sharder = build.trainer_sharders(None, plan)[0]
    sharding = to_sharding_plan(plan, tables, TRAIN_EBC_PATH, 1, 1, "cuda").plan[TRAIN_EBC_PATH]
    sharded = []
    for t in tables:
        ps = sharding[t.name]
        fused = convert_to_fbgemm_types(
            add_params_from_parameter_sharding(dict(sharder.fused_params), ps)
        )
        kernel = EmbeddingComputeKernel(ps.compute_kernel)
        sharded.append(
            ShardedEmbeddingTable(
                num_embeddings=t.num_embeddings,
                embedding_dim=t.embedding_dim,
                name=t.name,
                feature_names=t.feature_names,
                local_rows=t.num_embeddings,
                local_cols=t.embedding_dim,
                compute_kernel=kernel,
                fused_params=fused,
            )
        )
    groups = group_tables([sharded])[0]
    return [
        ([t.name for t in g.embedding_tables], (g.fused_params or {}).get("cache_load_factor"))
        for g in groups
    ]


def test_each_cached_table_gets_its_own_cache_with_the_plan_s_load_factor(
    tiny_dataset: Path,
) -> None:
    plan, tables = _uvm_plan(tiny_dataset)
    sharding = to_sharding_plan(plan, tables, TRAIN_EBC_PATH, 1, 1, "cuda").plan[TRAIN_EBC_PATH]
    assert sharding["t_f0"].compute_kernel == EmbeddingComputeKernel.FUSED_UVM_CACHING.value
    assert sharding["t_f3"].compute_kernel == EmbeddingComputeKernel.FUSED_UVM.value
    assert (sharding["t_f1"].cache_params.load_factor, sharding["t_f3"].cache_params) == (0.5, None)
    # Two cached tables on one rank: one TBE each (every table, torchrec's switch is global), so
    # neither shares the other's cache.
    assert sorted(_tbes(plan, tables)) == [
        (["t_f0"], 0.2),
        (["t_f1"], 0.5),
        (["t_f2"], None),
        (["t_f3"], None),
    ]
    # One cached table keeps its own TBE anyway (its cache settings differ); the others stay
    # grouped.
    one, tables = _uvm_plan(tiny_dataset, {"t_f1": ("fused_uvm_caching", 0.5)})
    assert "use_one_tbe_per_table" not in build.trainer_sharders(None, one)[0].fused_params
    assert sorted(_tbes(one, tables)) == [(["t_f0", "t_f2", "t_f3"], None), (["t_f1"], 0.5)]


def test_uvm_tables_are_sharded_on_cuda_with_the_fused_optimizer(
    tiny_dataset: Path, monkeypatch
) -> None:
    plan, tables = _uvm_plan(tiny_dataset)
    job = JobConfig()
    cpu = DistEnv(0, 0, 1, 1, torch.device("cpu"), "gloo")
    module = train_module.build_train_module(
        job.model, Manifest.load(tiny_dataset), tables, cpu, global_batch_size=BATCH, seed=0
    )
    sharding = to_sharding_plan(plan, tables, TRAIN_EBC_PATH, 1, 1, "cuda")
    seen = {}
    monkeypatch.setattr(build, "DistributedModelParallel", lambda module, **kw: seen.update(kw))
    monkeypatch.setattr(
        build, "ShardingEnv", type("FakeShardingEnv", (), {"from_process_group": staticmethod(id)})
    )
    cuda = DistEnv(0, 0, 1, 1, torch.device("cuda", 0), "nccl")
    build.shard_model(module, sharding, cuda, job.optim, qcomm=None, plan_file=plan)
    bags = module.model.sparse_arch.embedding_bag_collection.embedding_bags
    assert all(
        hasattr(bags[t.name].weight, "_optimizer_classes") for t in tables
    )  # the sparse optimizer, fused
    assert seen["sharders"][0].fused_params["use_one_tbe_per_table"] is True


def test_uvm_tables_on_cpu_are_refused_in_one_line(tiny_dataset: Path, tmp_path: Path) -> None:
    plan, tables = _uvm_plan(tiny_dataset)
    save_plan(plan, tmp_path / "plan.json")
    args = [
        "train",
        "--data",
        str(tiny_dataset),
        "--plan",
        str(tmp_path / "plan.json"),
        "--out-dir",
        str(tmp_path / "run"),
    ]
    result = CliRunner().invoke(
        app,
        [
            *args,
            "--nproc-per-node",
            "1",
            "--set",
            'train.device="cpu"',
            "--set",
            f"train.global_batch_size={BATCH}",
        ],
    )
    assert_one_line_error(
        result,
        "^error: "
        + re.escape(
            f"{tmp_path / 'plan.json'}: table t_f0: compute_kernel fused_uvm_caching keeps its weights in host memory "
            "for a GPU to read (UVM) and needs CUDA, but this job trains on cpu: train on a CUDA host, or re-plan "
            "for this machine with `shardrec plan --topology auto`"
        )
        + "$",
    )
    with pytest.raises(
        ValueError, match="^table t_f0: compute_kernel fused_uvm_caching keeps its weights"
    ):
        run_plan.build_sharding_plan(
            plan, tables, DistEnv(0, 0, 1, 1, torch.device("cpu"), "gloo"), BATCH
        )
