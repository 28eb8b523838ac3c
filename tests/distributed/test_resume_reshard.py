"""Resuming under another world size or plan reshards the checkpoint; failures stop cleanly.

A 2-rank row-wise run checkpoints at step 8 and runs on to 15 (the reference). Copies of its
run directory are resumed at step 8 by 1 rank (table-wise) and by 4 ranks (row-wise,
data-parallel and table-wise tables): both must end within the plan-invariance tolerance of
the reference. A column-wise checkpoint resumed table-wise must convert row-wise Adagrad state.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from spawn import run_ranks
from test_train_invariance import ATOL, RTOL, GLOBAL_BATCH, final_weights, job_config

STEPS, CKPT = 15, 8


def _job(env, data: str, run_dir: Path, layout: str, steps: int, extra: tuple = ()):
    import torch.distributed as dist

    from shardrec.dataloader.format import Manifest
    from shardrec.embeddings.tables import build_table_configs
    from shardrec.sharding.plan_io import save_plan
    from shardrec.trainer.run import build_job
    from train_plans import make_plan

    dims = {"f0": 4, "f2": 4} if any("dcnv2" in e for e in extra) else None
    tables = build_table_configs(Manifest.load(data), 8, dims)
    plan_path = run_dir.parent / f"{run_dir.name}-{layout}-w{env.world_size}.plan.json"
    if env.is_main:
        save_plan(make_plan(tables, layout, env.world_size, GLOBAL_BATCH), plan_path)
    dist.barrier()
    extra = extra + (f"checkpoint.interval_steps={CKPT}", "checkpoint.keep=5")
    return build_job(job_config(Path(data), steps, "sparse_dist", extra), env, run_dir, str(plan_path))


def two_rank_runs(env, data: str, root: str, multi_hot_data: str) -> dict:
    """The reference (row-wise) and a column-wise run; DCNv2 on multi-hot data with bf16
    all-to-all; the failure cases."""
    from shardrec.trainer.loop import NonFiniteLossError
    from shardrec.trainer.run import run_job

    root_p = Path(root)
    out = {"reference": run_job(_job(env, data, root_p / "ref", "row_wise", STEPS))["eval"]["val"]}
    run_job(_job(env, data, root_p / "cw", "column_wise", CKPT))
    dcn = ('model.arch="dcnv2"', 'sharding.qcomm="bf16"', "train.epochs=2", 'model.dims={"f0" = 4, "f2" = 4}')
    out["dcnv2"] = run_job(_job(env, multi_hot_data, root_p / "dcn", "mixed", 30, dcn))["eval"]["val"]

    # A NaN loss stops every rank with the step in the message; the last good checkpoint stays.
    os.environ["SHARDREC_FAULT"] = "nan:10"
    try:
        run_job(_job(env, data, root_p / "nan", "row_wise", STEPS))
    except NonFiniteLossError as e:
        out["nan_error"] = str(e)
    finally:
        del os.environ["SHARDREC_FAULT"]
    # A checkpoint of another model is refused with the difference named.
    other = _job(env, data, root_p / "ref", "row_wise", STEPS, ("model.over_arch=[8, 1]",))
    try:
        other.checkpoints.load_latest(other)
    except ValueError as e:
        out["mismatch_error"] = str(e)
    return out


def resume_runs(env, data: str, root: str, layout: str) -> dict:
    """Resume the copy made for this world size; then the column-wise run, re-saved under `layout`."""
    from shardrec.trainer.checkpoint import CheckpointManager
    from shardrec.trainer.run import run_job

    run_dir = Path(root) / f"resume-w{env.world_size}"
    job = _job(env, data, run_dir, layout, STEPS)
    summary = run_job(job)
    cw = _job(env, data, Path(root) / f"cw-w{env.world_size}", "table_wise", STEPS)
    cw.checkpoints.load_latest(cw)
    CheckpointManager(Path(root) / f"cw-resaved-w{env.world_size}" / "checkpoints", env, 1).save(cw)
    return {"resumed_from": summary["resumed_from_step"], "val": summary["eval"]["val"]}


def _momentum(weights: dict, table: str) -> torch.Tensor:
    return next(v for k, v in weights.items() if k.endswith(f"{table}.momentum1"))


def _fused_state(ckpt: Path, out: Path) -> dict:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(ckpt, out)
    state = torch.load(out, weights_only=False)["fused_optim"]["state"]
    return {name: value for entries in state.values() for name, value in entries.items()}


@pytest.mark.slow
def test_resume_reshards_to_other_world_sizes_and_failures_are_clear(tiny_dataset: Path, tmp_path: Path) -> None:
    from shardrec.trainer.optim_state import convert_rowwise_momentum

    from conftest import write_tiny_dataset

    write_tiny_dataset(tmp_path / "multi_hot", multi_hot=("f1", "f3"))
    two = run_ranks(two_rank_runs, 2, str(tiny_dataset), str(tmp_path), str(tmp_path / "multi_hot"))[0]
    assert two["dcnv2"]["auc"] > 0.65  # DCNv2, multi-hot bags, mixed widths, bf16 all-to-all: it learns
    assert "step 11" in two["nan_error"] and "NaN" in two["nan_error"]
    assert sorted(p.name for p in (tmp_path / "nan" / "checkpoints").iterdir()) == ["step-00000008"]
    assert "model.over_arch" in two["mismatch_error"]

    for world, layout in ((1, "table_wise"), (4, "mixed_rows")):
        # The reference's step-8 checkpoint, as if the run had been stopped there.
        shutil.copytree(tmp_path / "ref", tmp_path / f"resume-w{world}", ignore=shutil.ignore_patterns("step-00000015"))
        (tmp_path / f"resume-w{world}" / "metrics.jsonl").unlink()
        shutil.copytree(tmp_path / "cw", tmp_path / f"cw-w{world}")
        result = run_ranks(resume_runs, world, str(tiny_dataset), str(tmp_path), layout)[0]
        assert result["resumed_from"] == CKPT
        reference, resumed = final_weights(tmp_path / "ref"), final_weights(tmp_path / f"resume-w{world}")
        for key in reference:
            torch.testing.assert_close(resumed[key], reference[key], atol=ATOL, rtol=RTOL, msg=lambda m: f"w{world} {key}: {m}")
        assert result["val"]["auc"] == pytest.approx(two["reference"]["auc"], abs=1e-4)

        # Column-wise (2 column shards of 4) -> whole rows: the accumulators were converted.
        old = _fused_state(tmp_path / "cw" / "checkpoints" / f"step-{CKPT:08d}", tmp_path / "old.pt")
        new_ckpt = next((tmp_path / f"cw-resaved-w{world}" / "checkpoints").glob("step-*"))
        new = _fused_state(new_ckpt, tmp_path / "new.pt")
        for name, value in old.items():
            rows = new[name].numel()
            assert value.numel() == 2 * rows, name
            torch.testing.assert_close(new[name], convert_rowwise_momentum(value, rows, [4, 4], [8]))
            assert new[name].abs().sum() > 0
