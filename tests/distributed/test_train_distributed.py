"""The trainer across plans and world sizes, in three process groups (2, 1 and 4 ranks) that
each run several jobs, in two launches: the 1-rank group is the 2-rank group's rank 0 alone, once
that group is done (torchrec imports in seconds: every process started is the budget).

- Plan invariance: the same seed and global batch give the same model whatever the plan
  (table-wise, data-parallel, column-wise, and two mixes of row-wise, column-wise,
  data-parallel and table-wise tables) and world size (1, 2). Documented tolerance
  (trainer/model/objective.py): runs differ only in the order of float sums; after 15 steps every
  weight agrees within atol 1e-5 + rtol 1e-4 (measured <= 5e-7). Row-wise Adagrad is compared
  over plans without column cuts, sgd over plans with them (fbgemm's row-wise Adagrad keeps
  per-column-shard statistics), full Adagrad over both: fbgemm's EXACT_ADAGRAD table-wise and
  column-wise against torch.optim.Adagrad itself on the unsharded (data-parallel) table.
  Pipelined and plain loops do the same arithmetic: bitwise equal.
- Resharding on resume: a 2-rank row-wise run checkpoints at step 8 and runs on to 15; copies
  resumed at step 8 by 1 rank (table-wise) and 4 ranks (row-wise, data-parallel, table-wise
  tables) end within the same tolerance; a column-wise checkpoint loaded under whole-row plans
  (table-wise on 1 rank, data-parallel on 4) has its row-wise Adagrad state converted.
- Failures: a NaN loss stops every rank naming the step, keeping the last good checkpoint; a
  checkpoint of another model is refused naming the difference, leaving the run's files as they
  were. And DCNv2 on multi-hot bags with mixed widths and bf16 all-to-all learns.
- Full Adagrad's per-weight state resumes across plans: a column-wise checkpoint at step 8, resumed
  table-wise on 1 rank and data-parallel on 4, ends as the 2-rank run that went on.
- train.precision = "bf16" (autocast over the dense layers and the interaction), in the same process
  groups (a group of its own cost ~25 CPU-s of imports): a 2-rank row-wise bf16 run checkpoints at
  step 8 and runs on to 15; a copy resumed at step 8 on the same plan ends bitwise equal (bf16
  rounding is deterministic on CPU). At one world size the plans agree as closely as in fp32
  (atol 1e-5 + rtol 1e-4; measured 4.5e-8): every rank runs the same bf16 matmuls on the same
  samples whatever the plan. Across world sizes the per-rank batch changes, and with it the bf16
  rounding of the weight gradients (reduced over the rank's samples inside a bf16 matmul): after 15
  steps each weight's difference from the 1-rank run stays within 10% of its norm (measured 4.2%;
  fp32 against bf16 differ by 29%) and validation AUCs within 0.01.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers import final_step_counters, final_weights

from shardrec.trainer.distributed.local_ranks import run_local_ranks

GLOBAL_BATCH, STEPS, CKPT = 64, 15, 8
ATOL, RTOL = 1e-5, 1e-4
SGD = ('optim.sparse="sgd"', "optim.sparse_lr=0.5")
FULL = ('optim.sparse="adagrad"',)
DCN = (
    'model.arch="dcnv2"',
    'sharding.qcomm="bf16"',
    "train.epochs=2",
    'model.dims={"f0" = 4, "f2" = 4}',
)
INVARIANCE = {
    2: [
        ("adagrad", "table_wise", "sparse_dist", ()),
        ("adagrad", "data_parallel", "sparse_dist", ()),
        ("adagrad", "mixed_rows", "sparse_dist", ()),
        ("adagrad", "mixed_rows", "plain", ()),
        ("sgd", "column_wise", "sparse_dist", SGD),
        ("sgd", "mixed", "sparse_dist", SGD),
        # Full Adagrad keeps its state per weight, so column cuts are plan-invariant too; its
        # data-parallel tables are stepped by torch.optim.Adagrad itself on the unsharded weights.
        ("full", "data_parallel", "sparse_dist", FULL),
    ],
    1: [
        ("adagrad", "table_wise", "plain", ()),
        ("sgd", "table_wise", "plain", SGD),
        ("full", "table_wise", "plain", FULL),
    ],
}
RESUME_LAYOUT = {1: "table_wise", 4: "mixed_rows"}
# The column-wise checkpoint is loaded under whole-row tables: sharded (1 rank) and replicated (4
# ranks).
CW_LAYOUT = {1: "table_wise", 4: "data_parallel"}
# Full Adagrad's column-wise checkpoint resumed under whole-row tables: its state reshards like the
# weights.
FULL_CW, FULL_RESUME = "full-w2-column_wise-sparse_dist", {1: "table_wise", 4: "data_parallel"}
# allow_emulated_bf16: these runs check bf16's arithmetic, which an emulating CPU computes too.
BF16 = ('train.precision="bf16"', "train.allow_emulated_bf16=true")
BF16_REL_NORM, BF16_AUC = 0.1, 0.01


def job_config(data: Path, steps: int, pipeline: str, extra: tuple = ()):
    from shardrec.trainer.job.config import load_job_config

    overrides = [
        f'data.path="{data}"',
        "model.embedding_dim=8",
        "model.dense_arch=[16, 8]",
        "model.over_arch=[16, 1]",
        f"train.global_batch_size={GLOBAL_BATCH}",
        f"train.steps={steps}",
        f'train.pipeline="{pipeline}"',
        "train.log_interval=1000",
        'data.eval_splits=["val"]',
    ]
    return load_job_config(None, overrides + list(extra))


def build(
    env,
    data: str,
    run_dir: Path,
    layout: str,
    steps: int,
    pipeline: str = "sparse_dist",
    extra: tuple = (),
):
    """A job on `data` whose plan puts every table as `layout`
    (tests/distributed/train_plans.py)."""
    import torch.distributed as dist
    from train_plans import make_plan

    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.embeddings.tables import build_table_configs
    from shardrec.sharding.plan.plan_file import save_plan
    from shardrec.trainer.loop.train_job import build_job

    dims = {"f0": 4, "f2": 4} if extra is DCN else None
    tables = build_table_configs(Manifest.load(data), 8, dims)
    plan_path = run_dir.parent / f"{run_dir.name}.w{env.world_size}.plan.json"
    if env.is_main:
        save_plan(make_plan(tables, layout, env.world_size, GLOBAL_BATCH), plan_path)
    dist.barrier()
    return build_job(job_config(Path(data), steps, pipeline, extra), env, run_dir, str(plan_path))


def _checkpointed(env, data: str, run_dir: Path, layout: str, steps: int, extra: tuple = ()):
    return build(
        env,
        data,
        run_dir,
        layout,
        steps,
        extra=extra + (f"checkpoint.interval_steps={CKPT}", "checkpoint.keep=5"),
    )


def rank_work(env, data: str, multi_hot: str, root: str) -> dict:
    """Everything one process group runs (which depends on its world size)."""
    from shardrec.trainer.loop.job_run import run_job
    from shardrec.trainer.loop.steps import NonFiniteLossError
    from shardrec.trainer.rundir.checkpoint.manager import CheckpointManager

    # One thread per rank, as torchrun's ranks get (launch.py): ranks of one thread per core each
    # (run_local_ranks' default) spin on the cores the other ranks need, ~2x the CPU time.
    torch.set_num_threads(1)
    root_p, world, out = Path(root), env.world_size, {}
    for tag, layout, pipeline, extra in INVARIANCE.get(world, []):
        name = f"{tag}-w{world}-{layout}-{pipeline}"
        out[name] = run_job(build(env, data, root_p / name, layout, STEPS, pipeline, extra))[
            "eval"
        ]["val"]
    if world == 2:
        out["reference"] = run_job(_checkpointed(env, data, root_p / "ref", "row_wise", STEPS))[
            "eval"
        ]["val"]
        run_job(_checkpointed(env, data, root_p / "cw", "column_wise", CKPT))
        out[FULL_CW] = run_job(
            _checkpointed(env, data, root_p / FULL_CW, "column_wise", STEPS, FULL)
        )["eval"]["val"]
        out["dcnv2"] = run_job(build(env, multi_hot, root_p / "dcn", "mixed", 30, extra=DCN))[
            "eval"
        ]["val"]
        os.environ["SHARDREC_FAULT"] = "nan:10"
        try:
            run_job(_checkpointed(env, data, root_p / "nan", "row_wise", STEPS))
        except NonFiniteLossError as e:
            out["nan_error"] = str(e)
        finally:
            del os.environ["SHARDREC_FAULT"]
        other = _checkpointed(
            env, data, root_p / "ref", "row_wise", STEPS, ("model.over_arch=[8, 1]",)
        )
        try:
            run_job(other)
        except ValueError as e:
            out["mismatch_error"] = str(e)
    if world in (1, 2):
        out["bf16"] = bf16_work(env, data, root_p / "bf16")
    if world != 2:
        summary = run_job(
            _checkpointed(env, data, root_p / f"resume-w{world}", RESUME_LAYOUT[world], STEPS)
        )
        out["resume"] = {"from": summary["resumed_from_step"], "val": summary["eval"]["val"]}
        full = _checkpointed(
            env, data, root_p / f"full-resume-w{world}", FULL_RESUME[world], STEPS, FULL
        )
        out["resumed_full_from"] = run_job(full)["resumed_from_step"]
        cw = _checkpointed(env, data, root_p / f"cw-w{world}", CW_LAYOUT[world], STEPS)
        cw.checkpoints.load_latest()
        CheckpointManager(
            root_p / f"cw-resaved-w{world}" / "checkpoints", env, keep=1, parts=cw.checkpoints.parts
        ).save()
    return out


def bf16_work(env, data: str, root: Path) -> dict:
    """The bf16 runs of one process group: the 1-rank one, or the 2-rank ones (the fp32 row-wise run
    they are held against is the group's "ref")."""
    import torch.distributed as dist

    from shardrec.trainer.loop.job_run import run_job

    if env.world_size == 1:
        one_rank = build(env, data, root / "w1-table_wise", "table_wise", STEPS, "plain", BF16)
        return {"w1-table_wise": run_job(one_rank)["eval"]["val"]}
    out = {
        "ref": run_job(_checkpointed(env, data, root / "ref", "row_wise", STEPS, BF16))["eval"][
            "val"
        ]
    }
    if env.is_main:  # the step-8 checkpoint, as if the run had been stopped there
        shutil.copytree(
            root / "ref",
            root / "resumed",
            ignore=shutil.ignore_patterns(f"step-{STEPS:08d}", "metrics.jsonl"),
        )
    dist.barrier()
    summary = run_job(_checkpointed(env, data, root / "resumed", "row_wise", STEPS, BF16))
    out["resumed_from"], out["resumed"] = summary["resumed_from_step"], summary["eval"]["val"]
    assert out["resumed_from"] == CKPT
    out["w2-mixed_rows"] = run_job(
        build(env, data, root / "w2-mixed_rows", "mixed_rows", STEPS, extra=BF16)
    )["eval"]["val"]
    return out


def _copy_resume_points(root: Path) -> None:
    """The 2-rank runs' step-8 checkpoints, as if they had been stopped there, for the 1- and 4-rank
    resumes."""
    for world in (1, 4):
        shutil.copytree(
            root / "ref",
            root / f"resume-w{world}",
            ignore=shutil.ignore_patterns("step-00000015", "metrics.jsonl"),
        )
        shutil.copytree(root / "cw", root / f"cw-w{world}")
        shutil.copytree(
            root / FULL_CW,
            root / f"full-resume-w{world}",
            ignore=shutil.ignore_patterns("step-00000015", "metrics.jsonl"),
        )


def two_then_one_rank(env, data: str, multi_hot: str, root: str) -> dict:
    """The 2-rank group's work, then rank 0 alone in a group of its own runs the 1-rank group's (its
    results under "w1"): one process start fewer. Only a group of this process alone can follow:
    torchrec agrees on some settings once per process, at its first sharded model, and a fresh
    process in the next group would wait for an agreement this one no longer takes part in."""
    from shardrec.trainer.distributed.dist import init_local_rank, shutdown

    out = rank_work(env, data, multi_hot, root)
    if env.is_main:
        shutdown()
        _copy_resume_points(Path(root))
        # port 0: a group of one, whose own store binds a port of the kernel's choosing
        out["w1"] = rank_work(init_local_rank(0, 1, 0), data, multi_hot, root)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    from conftest import write_tiny_dataset

    root = tmp_path_factory.mktemp("train")
    write_tiny_dataset(root / "data")
    write_tiny_dataset(root / "multi_hot", multi_hot=("f1", "f3"))
    args = (str(root / "data"), str(root / "multi_hot"), str(root))
    # ~23 jobs in this launch (the bf16 ones too): a machine loaded to 15 can take it past the
    # default 300 s.
    results = run_local_ranks(two_then_one_rank, 2, *args, timeout_s=900)[0]
    results["w4"] = run_local_ranks(rank_work, 4, *args, timeout_s=900)[0]
    one_rank = results.pop("w1")
    results["bf16"].update(one_rank.pop("bf16"))
    results.update(one_rank)
    return root, results


def assert_same_model(run_dir: Path, reference: Path) -> None:
    ref, weights = final_weights(reference), final_weights(run_dir)
    assert weights.keys() == ref.keys(), run_dir.name
    for key, value in ref.items():
        torch.testing.assert_close(
            weights[key],
            value,
            atol=ATOL,
            rtol=RTOL,
            msg=lambda m, key=key: f"{run_dir.name} {key}: {m}",
        )


@pytest.mark.slow
def test_plans_and_world_sizes_give_the_same_model(runs) -> None:
    root, metrics = runs
    for opt in ("adagrad", "sgd", "full"):
        reference = f"{opt}-w1-table_wise-plain"
        others = [name for name in metrics if name.startswith(opt) and name != reference]
        assert len(others) >= 2
        for name in others:
            assert_same_model(root / name, root / reference)
            assert metrics[name]["auc"] == pytest.approx(metrics[reference]["auc"], abs=1e-4)
    # The pipeline changes when input distribution happens, not the arithmetic.
    plain = final_weights(root / "adagrad-w2-mixed_rows-plain")
    pipelined = final_weights(root / "adagrad-w2-mixed_rows-sparse_dist")
    assert all(torch.equal(plain[key], pipelined[key]) for key in plain)
    assert metrics["adagrad-w1-table_wise-plain"]["auc"] > 0.7  # it learned: this test can fail


@pytest.mark.slow
def test_resume_reshards_to_one_and_four_ranks(runs) -> None:
    from shardrec.embeddings.optim_layouts import convert_rowwise_momentum

    root, results = runs
    # fbgemm's step counters (Adam's bias correction reads them; row-wise Adagrad's kernel does not,
    # but counts alike): one per table, the optimizer steps taken.
    counted = final_step_counters(root / "ref")
    assert counted == {f"t_f{i}": STEPS for i in range(4)}, counted
    for world in (1, 4):
        resumed = results if world == 1 else results["w4"]
        assert resumed["resume"]["from"] == CKPT
        assert_same_model(root / f"resume-w{world}", root / "ref")
        # Restored at step 8 under another plan and world size, counted on from there (data-parallel
        # tables have no TBE, hence no counter).
        counters = final_step_counters(root / f"resume-w{world}")
        assert counters and counters == {t: counted[t] for t in counters}, (world, counters)
        assert resumed["resume"]["val"]["auc"] == pytest.approx(
            results["reference"]["auc"], abs=1e-4
        )
        # Column-wise (2 column shards of 4) -> whole rows: the accumulators were converted.
        old = final_weights(root / "cw", "fused_optim")
        new = final_weights(root / f"cw-resaved-w{world}", "fused_optim")
        for name, value in old.items():
            rows = new[name].numel()
            assert value.numel() == 2 * rows, name
            torch.testing.assert_close(
                new[name], convert_rowwise_momentum(value, rows, [4, 4], [8])
            )
            assert new[name].abs().sum() > 0
        # Full Adagrad, column-wise -> table-wise (1 rank) / data-parallel (4 ranks): ends as the
        # run that went on.
        assert resumed["resumed_full_from"] == CKPT
        assert_same_model(root / f"full-resume-w{world}", root / FULL_CW)
        saved, went_on = (
            final_weights(root / f"full-resume-w{world}", "fused_optim"),
            final_weights(root / FULL_CW, "fused_optim"),
        )
        assert saved.keys() == went_on.keys() and all(
            v.dim() == 2 for v in saved.values()
        )  # [rows, dim] sums
        for name, value in went_on.items():
            torch.testing.assert_close(saved[name], value, atol=ATOL, rtol=RTOL)


@pytest.mark.slow
def test_failures_stop_cleanly_and_dcnv2_learns(runs) -> None:
    root, results = runs
    assert "step 11" in results["nan_error"] and "NaN" in results["nan_error"]
    # The fault poisons the over arch's weights: the line says the NaN began there.
    assert "first in the over arch (over_arch), from finite inputs" in results["nan_error"]
    assert sorted(p.name for p in (root / "nan" / "checkpoints").iterdir()) == ["step-00000008"]
    assert "model.over_arch" in results["mismatch_error"]
    # The refused resume left the run directory describing its checkpoints, not the refused job.
    assert "over_arch = [16, 1]" in (root / "ref" / "config.toml").read_text()
    assert results["dcnv2"]["auc"] > 0.65  # DCNv2, multi-hot bags, mixed widths, bf16 all-to-all


@pytest.mark.slow
def test_bf16_resume_is_bitwise_equal(runs) -> None:
    root, results = runs
    root, results = root / "bf16", results["bf16"]
    ref, resumed = final_weights(root / "ref"), final_weights(root / "resumed")
    assert ref.keys() == resumed.keys()
    different = [key for key in ref if not torch.equal(ref[key], resumed[key])]
    assert not different, f"resumed bf16 run differs in {different}"
    # Checkpoints hold fp32 weights, whatever the precision.
    assert {v.dtype for v in ref.values() if torch.is_floating_point(v)} == {torch.float32}
    timeless = {k: v for k, v in results["ref"].items() if k != "seconds"}
    assert {k: results["resumed"][k] for k in timeless} == timeless


@pytest.mark.slow
def test_bf16_plans_and_world_sizes_agree_within_the_bf16_tolerance(runs) -> None:
    fp32_root, results = runs
    root, results = fp32_root / "bf16", results["bf16"]
    one_rank, row_wise, mixed = (
        final_weights(root / name) for name in ("w1-table_wise", "ref", "w2-mixed_rows")
    )
    for key, value in row_wise.items():  # two plans, one world size: fp32's tolerance
        torch.testing.assert_close(
            mixed[key], value, atol=ATOL, rtol=RTOL, msg=lambda m, key=key: f"w2 plans, {key}: {m}"
        )
    for key, value in one_rank.items():  # one rank against two: bf16's
        rel = float((row_wise[key] - value).norm() / value.norm())
        assert rel <= BF16_REL_NORM, f"{key}: 1 vs 2 ranks differ by {rel:.3f} of its norm"
    for name in ("ref", "w2-mixed_rows"):
        assert results[name]["auc"] == pytest.approx(
            results["w1-table_wise"]["auc"], abs=BF16_AUC
        ), name
    assert results["w1-table_wise"]["auc"] > 0.7  # it learned under bf16
    # bf16 really changed the arithmetic: the fp32 model (the same row-wise job) lies outside fp32's
    # own tolerance.
    fp32 = final_weights(fp32_root / "ref")
    assert any(not torch.allclose(fp32[k], row_wise[k], atol=ATOL, rtol=RTOL) for k in fp32)
