"""After training: the target-AUC stop, `shardrec eval` (equal to the run's own evaluation bit
for bit at its world size, resharded at another) and a scaled-down configs/dlrmv2.toml end to end.
`shardrec export` -> `shardrec predict`: test_export_predict.py, test_predict_vocab_multihot.py,
test_export_predict_refusals.py.

One training run (2 ranks, synth -> preprocess -> train with a low target AUC: conftest's
`after_training`, once a session) serves every test here and in those three; its rerun,
complete at the target, writes nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from after_training import (
    BATCH,
    FRACTION,
    INIT_EVENTS,
    REPO,
    TARGET,
    TRAIN_TO_TARGET,
    final_eval,
    in_process,
    ok,
    run_records,
    shardrec,
)
from helpers import assert_one_line_error, final_step_counters
from mlperf_compliance import compliance_errors, read_log


@pytest.mark.slow
def test_target_auc_stops_the_run_and_records_time_and_samples(after_training: Path) -> None:
    summary = json.loads((after_training / "run" / "summary.json").read_text())
    records = run_records(after_training / "run")
    steps_per_epoch = 2000 // BATCH
    every = int(FRACTION * steps_per_epoch)
    evals = [r for r in records if r["kind"] == "eval" and r["split"] == "val" and not r["final"]]
    assert [r["step"] for r in evals] == list(range(every, every * len(evals) + 1, every))
    first_hit = next(r for r in evals if r["auc"] >= TARGET)
    assert all(r["auc"] < TARGET for r in evals if r["step"] < first_hit["step"])
    (target,) = [r for r in records if r["kind"] == "target"]
    assert target["step"] == first_hit["step"] == summary["steps"] < 3 * steps_per_epoch
    assert target["samples_to_target"] == summary["samples_to_target"] == first_hit["step"] * BATCH
    assert summary["target_reached"] is True and summary["time_to_target_s"] > 0
    assert (after_training / "run" / "checkpoints" / f"step-{summary['steps']:08d}").is_dir()
    # fbgemm's step counters (Adam's bias correction) count the optimizer steps, not the
    # evaluation batches between them.
    counters = final_step_counters(after_training / "run")
    assert counters and set(counters.values()) == {summary["steps"]}, counters


@pytest.mark.slow
def test_a_run_stopped_at_its_target_is_complete_until_the_target_changes(
    after_training: Path,
) -> None:
    run = after_training / "run"
    record = {
        name: (run / name).read_bytes() for name in ("metrics.jsonl", "summary.json", "config.toml")
    }
    steps = json.loads(record["summary.json"])["steps"]
    (target,) = [r for r in run_records(run) if r["kind"] == "target"]
    again = ok(in_process(*TRAIN_TO_TARGET, cwd=after_training))  # complete: no rank starts
    assert again.stderr.strip() == (
        f"run is complete: the target AUC was reached at step {steps} (val AUC {target['auc']:.5f} >= "
        f"train.target_auc = {TARGET}); nothing to do. To continue it, raise or clear the target "
        "(--set train.target_auc=0 --allow-change train.target_auc); to start over, add --restart"
    )
    assert json.loads(again.stdout)["steps"] == steps
    assert {name: (run / name).read_bytes() for name in record} == record
    # A raised or cleared target continues the run, once allowed (checked without training).
    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.trainer.job.config import load_job_config
    from shardrec.trainer.rundir.life import lifecycle

    manifest = Manifest.load(after_training / "data")
    for target_auc in (0.0, 0.99):
        job = load_job_config(run / "config.toml", [f"train.target_auc={target_auc}"])
        assert lifecycle.check_run_dir(run, job, manifest, ["train.target_auc"]) == "resume"
        with pytest.raises(
            ValueError, match=rf"train\.target_auc: {TARGET} -> {target_auc}\); accept them"
        ):
            lifecycle.check_run_dir(run, job, manifest, [])
    assert (
        lifecycle.check_run_dir(run, load_job_config(run / "config.toml"), manifest, [])
        == "complete"
    )


def _as_if_trained_on_cuda(run: Path, copy: Path) -> Path:
    """A copy of `run` whose config and plan say it trained on CUDA, as a GPU run's do."""
    shutil.copytree(run, copy, dirs_exist_ok=True)
    config = copy / "config.toml"
    config.write_text(config.read_text().replace('device = "cpu"', 'device = "cuda"', 1))
    assert 'device = "cuda"' in config.read_text()
    plan = json.loads((copy / "plan.json").read_text())
    plan["fingerprint"]["device_kind"] = "cuda"
    (copy / "plan.json").write_text(json.dumps(plan))
    return copy


@pytest.mark.slow
def test_eval_equals_the_runs_final_evaluation_bitwise_and_reshards(after_training: Path) -> None:
    final = final_eval(after_training / "run", "val")
    # Without --nproc-per-node: the run's own world size (2), hence its own evaluation's bits.
    evaluated = ok(shardrec("eval", "run", "--split", "val", "--json", cwd=after_training))
    assert "Warning" not in evaluated.stderr, evaluated.stderr[-3000:]
    same = json.loads(evaluated.stdout)
    assert same["world_size"] == 2
    assert (same["auc"], same["logloss"], same["samples"]) == (
        final["auc"],
        final["logloss"],
        final["samples"],
    )
    # From another directory: the run's config.toml holds its data.path ("data" as typed) absolute.
    # On 1 rank, where the run's column-wise constraint cannot hold, the planner places t_C3 freely.
    # The copy evaluated says it trained on CUDA (its config and plan): --device cpu evaluates it
    # on CPU ranks all the same, on this host without a GPU.
    elsewhere = after_training / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    gpu_run = _as_if_trained_on_cuda(after_training / "run", elsewhere / "gpu-run")
    other = json.loads(
        ok(
            shardrec(
                "eval",
                str(gpu_run),
                "--split",
                "val",
                "--nproc-per-node",
                "1",
                "--device",
                "cpu",
                "--json",
                cwd=elsewhere,
            )
        ).stdout
    )
    assert other["world_size"] == 1 and other["trained_world_size"] == 2
    assert other["auc"] == pytest.approx(final["auc"], abs=1e-6)
    missing = in_process("eval", "run", "--checkpoint", "999", cwd=after_training)
    assert_one_line_error(missing, r"no complete checkpoint of step 999 \(has steps \d+")


def test_eval_of_a_run_that_trained_compiled_runs_eagerly_and_says_no_compile(
    after_training: Path,
) -> None:
    """README: evaluation runs the dense layers eagerly. eval of a run of train.compile = "on" said
    "compiling the dense layers and the interaction (train.compile)" all the same."""
    copy = after_training / "run-on"
    shutil.copytree(after_training / "run", copy, dirs_exist_ok=True)
    config = copy / "config.toml"
    config.write_text(config.read_text().replace('compile = "auto"', 'compile = "on"', 1))
    assert 'compile = "on"' in config.read_text()
    done = ok(shardrec("eval", "run-on", "--split", "val", "--json", cwd=after_training))
    assert "compil" not in done.stderr, done.stderr[-3000:]
    assert json.loads(done.stdout)["auc"] == final_eval(after_training / "run", "val")["auc"]


@pytest.mark.slow
def test_dlrmv2_config_scaled_down_runs_end_to_end(after_training: Path) -> None:
    done = ok(
        shardrec(
            "train",
            "--config",
            str(REPO / "configs" / "dlrmv2.toml"),
            "--data",
            "data",
            "--out-dir",
            "dlrmv2",
            "--nproc-per-node",
            "2",
            "--steps",
            "4",
            "--json",
            "--set",
            'train.device="cpu"',
            "--set",
            "train.global_batch_size=128",
            "--set",
            "data.multihot_rows=[]",
            "--set",
            'data.multihot_cache="cache"',
            "--set",
            "model.embedding_dim=8",
            "--set",
            "model.dense_arch=[16, 8]",
            "--set",
            "model.over_arch=[32, 16, 1]",
            "--set",
            "model.dcn_low_rank=8",
            cwd=after_training,
        )
    )
    summary = json.loads(done.stdout)
    assert (
        summary["steps"] == 4
        and summary["target_auc"] == 0.80275
        and summary["target_reached"] is False
    )
    plan = json.loads((after_training / "dlrmv2" / "plan.json").read_text())
    assert len(plan["tables"]) == 26
    # The on-the-fly multi-hot ids: the 100-hot feature's index table was drawn into the cache.
    assert any((after_training / "cache").rglob("*.npy"))
    # 4 steps of 15 per epoch: evaluations every 5% of an epoch are every step; validation only,
    # test once at the end.
    evals = [
        (r["step"], r["split"])
        for r in run_records(after_training / "dlrmv2")
        if r["kind"] == "eval"
    ]
    assert evals == [(1, "val"), (2, "val"), (3, "val"), (4, "val"), (4, "test")]
    # Scaled down, it is no closed-division run, and each setting that says so is warned about.
    rule = "warning: MLPerf DLRMv2 rule broken: "
    broken = [
        line.removeprefix(rule).split(" = ")[0]
        for line in done.stderr.splitlines()
        if line.startswith(rule)
    ]
    assert broken == [
        "train.steps",
        "model.embedding_dim",
        "model.dense_arch",
        "model.over_arch",
        "model.dcn_low_rank",
        "data.multihot_rows",
        "train.global_batch_size",
    ], done.stderr[-3000:]
    # Its MLPerf log, event by event, as the compliance checker reads a closed dlrm_dcnv2 log.
    log = read_log(after_training / "dlrmv2" / "mllog.jsonl")
    val_aucs = [
        r["auc"]
        for r in run_records(after_training / "dlrmv2")
        if r["kind"] == "eval" and r["split"] == "val"
    ]
    assert [r["key"] for r in log] == INIT_EVENTS + [
        "init_stop",
        "run_start",
        "train_samples",
        "epoch_start",
    ] + [
        "eval_start",
        "eval_accuracy",
        "eval_stop",
        "eval_samples",
    ] + 3 * ["eval_start", "eval_accuracy", "eval_stop"] + ["epoch_stop", "run_stop"]
    assert [r["value"] for r in log if r["key"] == "eval_accuracy"] == val_aucs
    assert [r["metadata"]["epoch_num"] for r in log if r["key"] == "eval_accuracy"] == [
        s / 15 for s in (1, 2, 3, 4)
    ]
    assert log[-1]["metadata"]["status"] == "aborted"  # 4 steps did not reach 0.80275
    values = {r["key"]: r["value"] for r in log}
    from shardrec.dataloader.format.manifest import Manifest

    assert (
        values["eval_samples"] == Manifest.load(after_training / "data").splits["val"].rows
    )  # the whole split, once
    assert (
        values["opt_base_learning_rate"],
        values["global_batch_size"],
        values["train_samples"],
    ) == (
        0.004,
        128,
        15 * 128,
    )
    assert values["submission_platform"] == "2xcpu" and values["submission_org"] == "shardrec"
    # No seed set: one drawn from the OS for this run, logged, and kept for a resume.
    from shardrec.trainer.job.config import load_job_config

    seed = load_job_config(after_training / "dlrmv2" / "config.toml").train.seed
    assert values["seed"] == seed >= 0 and f"train.seed = {seed} (drawn from the OS)" in done.stderr
    # The clock: run_start after init_stop, every event after it in order.
    times = [r["time_ms"] for r in log]
    assert times == sorted(times)
    # Not converged, so the one check it fails is the target's; at the target it would pass.
    assert compliance_errors(log, values["eval_samples"], 0.80275) == [
        "no eval_accuracy in [0.80275, 1]"
    ]
    assert compliance_errors(log, values["eval_samples"], min(val_aucs)) == []
    # Full Adagrad's run evaluates at another world size and exports like any other.
    test_auc = next(
        r["auc"]
        for r in run_records(after_training / "dlrmv2")
        if r["kind"] == "eval" and r["split"] == "test"
    )
    again = json.loads(
        ok(
            shardrec(
                "eval",
                "dlrmv2",
                "--split",
                "test",
                "--nproc-per-node",
                "1",
                "--json",
                cwd=after_training,
            )
        ).stdout
    )
    assert again["world_size"] == 1 and again["auc"] == pytest.approx(test_auc, abs=1e-6)
    ok(in_process("export", "dlrmv2", "--out", "dlrmv2.safetensors", cwd=after_training))
    assert (after_training / "dlrmv2.safetensors").stat().st_size > 0


@pytest.mark.slow
def test_eval_on_a_rank_count_the_batch_does_not_divide_names_those_it_does(
    after_training: Path,
) -> None:
    assert_one_line_error(
        in_process("eval", "run", "--nproc-per-node", "3", "--device", "cpu", cwd=after_training),
        rf"^error: the run's evaluation batch {BATCH} does not divide by 3 ranks \(eval.batch_size, "
        r"else train.global_batch_size\): use --nproc-per-node 1, 2, 4 or 8$",
    )
