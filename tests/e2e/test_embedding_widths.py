"""Embedding widths fbgemm's kernels cannot take are refused in one line before any rank starts:
a plan whose column shards are not a multiple of 4 columns wide (a hand-edited plan: 12 columns
cut in two for 3 ranks) started 3 ranks, whose torchrec asserted "local_cols=6 not divisible by 4"
inside rank 1, and ended in the lost-rank lines of the others; so did a table width of 6."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from helpers import assert_one_line_error, settings, train_command

WORLD_SIZE, GLOBAL_BATCH, DIM = 3, 48, 12


def _plan_cutting_t_f0_in_halves(data: Path, path: Path) -> None:
    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.embeddings.tables import build_table_configs
    from shardrec.sharding.plan.plan_file import plan_fingerprint, save_plan
    from shardrec.sharding.plan.plan_types import PLAN_SCHEMA_VERSION, PlanFile, Shard, TablePlan

    configs = build_table_configs(Manifest.load(data), DIM)
    half = DIM // 2
    tables = [
        TablePlan(c.name, "table_wise", "fused", [Shard(0, 0, 0, c.num_embeddings, DIM)])
        for c in configs[1:]
    ]
    rows = configs[0].num_embeddings
    cut = TablePlan(
        configs[0].name,
        "column_wise",
        "fused",
        [Shard(0, 0, 0, rows, half), Shard(1, 0, half, rows, half)],
    )
    fingerprint = plan_fingerprint(configs, WORLD_SIZE, GLOBAL_BATCH, "cpu")
    save_plan(PlanFile(PLAN_SCHEMA_VERSION, fingerprint, [cut, *tables]), path)


def test_column_shards_not_a_multiple_of_4_wide_are_refused_before_ranks_start(
    tiny_dataset: Path, tmp_path: Path
):
    plan = tmp_path / "plan.json"
    _plan_cutting_t_f0_in_halves(tiny_dataset, plan)
    job = settings(
        'train.device="cpu"',
        f"model.embedding_dim={DIM}",
        f"model.dense_arch=[16, {DIM}]",
        "model.over_arch=[16, 1]",
        f"train.global_batch_size={GLOBAL_BATCH}",
        "train.steps=1",
    )
    cmd = train_command(tiny_dataset, tmp_path / "run", "--plan", str(plan), *job, nproc=WORLD_SIZE)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert_one_line_error(
        done,
        "^error: " + re.escape(str(plan)) + r": table t_f0: its column shards are 6 columns wide, "
        r"not a multiple of 4 \(fbgemm's kernels need one; was the plan edited\? re-run "
        r"`shardrec plan`\)$",
    )
    assert not (tmp_path / "run").exists()


def test_a_table_width_not_a_multiple_of_4_is_refused_before_ranks_start(
    tiny_dataset: Path, tmp_path: Path
):
    """model.embedding_dim = 6 started the ranks, which died on torchrec's assertion
    "local_cols=6 not divisible by 4" at any world size and under any plan."""
    job = settings(
        'train.device="cpu"',
        "model.embedding_dim=6",
        "model.dense_arch=[16, 6]",
        f"train.global_batch_size={GLOBAL_BATCH}",
        "train.steps=1",
    )
    cmd = train_command(tiny_dataset, tmp_path / "run", *job, nproc=WORLD_SIZE)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert_one_line_error(
        done,
        r"^error: --set 'model\.embedding_dim=6': model\.embedding_dim = 6: fbgemm's embedding "
        r"kernels take widths that are a multiple of 4, such as 8$",
    )
    assert not (tmp_path / "run").exists()
