"""After training: the target-AUC stop, `shardrec eval` (equal to the run's own evaluation bit
for bit at its world size, resharded at another), `shardrec export` -> `shardrec predict`
(split and raw-text rows agree with eval), and a scaled-down configs/dlrmv2.toml end to end.

One training run (2 ranks, synth -> preprocess -> train with a low target AUC) serves every
test but the DLRMv2 one; its rerun, complete at the target, writes nothing.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import TINY_MODEL, assert_one_line_error, final_step_counters, settings
from mlperf_compliance import compliance_errors, read_log
from typer.testing import CliRunner, Result

from shardrec.tools.cli.app import app

REPO = Path(__file__).resolve().parents[2]
BATCH = 128
TARGET = 0.6
FRACTION = 0.25
TINY = settings(
    'train.device="cpu"',
    *TINY_MODEL,
    f"train.global_batch_size={BATCH}",
    'data.eval_splits=["val", "test"]',
    # A constraint that holds on 2 ranks only (two 4-wide column shards on distinct ranks):
    # evaluating on another number of ranks must still work.
    'sharding.constraints={t_C3={sharding_types=["column_wise"], min_partition=4}}',
)
INIT_EVENTS = (
    "cache_clear init_start submission_benchmark submission_org submission_division submission_status "
    "submission_platform global_batch_size gradient_accumulation_steps seed opt_name opt_base_learning_rate "
    "opt_adagrad_learning_rate_decay opt_weight_decay opt_adagrad_initial_accumulator_value opt_adagrad_epsilon "
    "opt_learning_rate_warmup_steps opt_learning_rate_decay_start_step opt_learning_rate_decay_steps"
).split()
TO_TARGET = settings(
    "train.epochs=3", f"eval.every_epoch_fraction={FRACTION}", f"train.target_auc={TARGET}"
)


def shardrec(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shardrec.tools.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def in_process(*args: str, cwd: Path) -> Result:
    """`shardrec ARGS` in directory cwd, in this process: for the commands that start no ranks
    (synth, preprocess, export, predict, and refusals and reruns that end before any rank starts),
    which would otherwise pay an interpreter start (and torch's import) each."""
    with contextlib.chdir(cwd):
        return CliRunner().invoke(app, list(args))


TRAIN_TO_TARGET = (
    "train",
    "--data",
    "data",
    "--out-dir",
    "run",
    "--nproc-per-node",
    "2",
    "--json",
    *TINY,
    *TO_TARGET,
)
"""`shardrec train` of the tiny model on data into run, stopping at the target AUC."""


def ok(done: subprocess.CompletedProcess | Result) -> subprocess.CompletedProcess | Result:
    if isinstance(done, Result):
        assert done.exit_code == 0, f"{done.output[-3000:]}\n{done.exception!r}"
    else:
        assert done.returncode == 0, f"{done.args}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A preprocessed dataset (day_0: train, day_1: val + test) and a run that stopped at the
    target."""
    root = tmp_path_factory.mktemp("after_training")
    ok(in_process("synth", "raw", "--rows", "4000", "--days", "2", "--max-vocab", "500", cwd=root))
    ok(
        in_process(
            "preprocess", "raw/day_0", "raw/day_1", "--out", "data", "--max-ids", "1000", cwd=root
        )
    )
    done = ok(
        shardrec(*TRAIN_TO_TARGET, cwd=root)
    )  # a process of its own: its stderr is the ranks' too
    # torch's deprecation notices about calls torchrec makes are no concern of the user's.
    assert "Warning" not in done.stderr, done.stderr[-3000:]
    return root


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _final(run: Path, split: str) -> dict:
    (record,) = [
        r for r in _records(run) if r["kind"] == "eval" and r["final"] and r["split"] == split
    ]
    return record


@pytest.mark.slow
def test_target_auc_stops_the_run_and_records_time_and_samples(trained: Path) -> None:
    summary = json.loads((trained / "run" / "summary.json").read_text())
    records = _records(trained / "run")
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
    assert (trained / "run" / "checkpoints" / f"step-{summary['steps']:08d}").is_dir()
    # fbgemm's step counters (Adam's bias correction) count the optimizer steps, not the
    # evaluation batches between them.
    counters = final_step_counters(trained / "run")
    assert counters and set(counters.values()) == {summary["steps"]}, counters


@pytest.mark.slow
def test_a_run_stopped_at_its_target_is_complete_until_the_target_changes(trained: Path) -> None:
    run = trained / "run"
    record = {
        name: (run / name).read_bytes() for name in ("metrics.jsonl", "summary.json", "config.toml")
    }
    steps = json.loads(record["summary.json"])["steps"]
    (target,) = [r for r in _records(run) if r["kind"] == "target"]
    again = ok(in_process(*TRAIN_TO_TARGET, cwd=trained))  # complete: no rank starts
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

    manifest = Manifest.load(trained / "data")
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
def test_eval_equals_the_runs_final_evaluation_bitwise_and_reshards(trained: Path) -> None:
    final = _final(trained / "run", "val")
    # Without --nproc-per-node: the run's own world size (2), hence its own evaluation's bits.
    evaluated = ok(shardrec("eval", "run", "--split", "val", "--json", cwd=trained))
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
    elsewhere = trained / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    gpu_run = _as_if_trained_on_cuda(trained / "run", elsewhere / "gpu-run")
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
    missing = in_process("eval", "run", "--checkpoint", "999", cwd=trained)
    assert_one_line_error(missing, r"no complete checkpoint of step 999 \(has steps \d+")


@pytest.mark.slow
def test_export_then_predict_matches_eval_on_a_split_and_on_raw_rows(trained: Path) -> None:
    ok(in_process("export", "run", "--out", "model.safetensors", cwd=trained))
    from safetensors import safe_open

    with safe_open(str(trained / "model.safetensors"), framework="pt") as f:
        header = json.loads(f.metadata()["shardrec"])
        assert len([k for k in f.keys() if ".embedding_bags." in k]) == 26
    assert (
        header["transform"]["mode"] == "hash"
        and header["transform"]["cardinalities"] == [1000] * 26
    )
    split = json.loads(
        ok(
            in_process(
                "predict",
                "model.safetensors",
                "data",
                "--split",
                "test",
                "--out",
                "split.npy",
                "--json",
                cwd=trained,
            )
        ).stdout
    )
    assert split["rows"] == 1000 and split["auc"] == pytest.approx(
        _final(trained / "run", "test")["auc"], abs=1e-6
    )
    # The test split is the second half of day_1: the same rows as raw text, transformed by predict.
    lines = (trained / "raw" / "day_1").read_bytes().splitlines(keepends=True)
    (trained / "test.tsv").write_bytes(b"".join(lines[-1000:]))
    ok(in_process("predict", "model.safetensors", "test.tsv", "--out", "raw.txt", cwd=trained))
    raw = np.loadtxt(trained / "raw.txt")
    np.testing.assert_allclose(raw, np.load(trained / "split.npy"), rtol=0, atol=1e-6)
    bad = trained / "bad.tsv"
    bad.write_bytes(lines[-1] + b"1\tnot-a-row\n")
    assert_one_line_error(
        in_process("predict", "model.safetensors", "bad.tsv", cwd=trained),
        r"bad.tsv:2: row: 2 fields, .* \(too_few_fields\)",
    )
    assert_one_line_error(
        in_process("predict", "test.tsv", "data", cwd=trained),
        r"test.tsv: not a safetensors model file",
    )
    # Rows without a label column (as Criteo's test.txt): named, then scored with --no-label.
    (trained / "nolabel.tsv").write_bytes(
        b"".join(line.split(b"\t", 1)[1] for line in lines[-1000:])
    )
    assert_one_line_error(
        in_process("predict", "model.safetensors", "nolabel.tsv", cwd=trained),
        r"nolabel.tsv: rows of at most 39 fields, a labeled row has 40: no label column \(as Criteo's "
        r"test.txt\)\? score them with --no-label$",
    )
    unlabeled = ok(
        in_process(
            "predict",
            "model.safetensors",
            "nolabel.tsv",
            "--no-label",
            "--out",
            "nl.txt",
            cwd=trained,
        )
    )
    # (Its next lines count the lookups of rows that never trained: test_predict_untrained_rows.py.)
    assert unlabeled.stderr.splitlines()[0] == (
        "wrote 1,000 probabilities to nl.txt (no labels, no AUC)"
    )
    np.testing.assert_array_equal(np.loadtxt(trained / "nl.txt"), raw)


PREDICT_WITHOUT_TORCH = """
import sys
from typer.testing import CliRunner
from shardrec.tools.cli.app import app
result = CliRunner().invoke(app, sys.argv[1:])
print(result.exit_code, "torch" in sys.modules, (result.stderr.strip().splitlines() or [""])[-1])
"""


@pytest.mark.slow
def test_raw_rows_of_another_shape_are_refused_before_torch_with_a_hint_that_works(
    trained: Path,
) -> None:
    """Rows the model cannot read: a CSV (its hint: the spec infer that starts a model for them),
    an extra field (its hint: the cut that drops it), labeled rows with --no-label (the counts of
    the user's rows); each hint's command is run here and works."""
    if not (trained / "model.safetensors").is_file():
        ok(in_process("export", "run", "--out", "model.safetensors", cwd=trained))
    ok(in_process("synth", "ml", "--like", "movielens", "--rows", "300", cwd=trained))
    # Refused by the model's header and the file's first rows alone: torch is never imported.
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            PREDICT_WITHOUT_TORCH,
            "predict",
            "model.safetensors",
            "ml/train.csv",
        ],
        cwd=trained,
        capture_output=True,
        text=True,
        timeout=300,
    )
    code, torch_loaded, line = done.stdout.strip().split(" ", 2)
    assert (code, torch_loaded) == ("1", "False"), done.stdout + done.stderr[-2000:]
    assert line == (
        "error: ml/train.csv:1: row: 1 fields, schema needs at least 37 of 40 (too_few_fields) (a "
        "CSV row: this model reads Criteo's tab-separated rows of 40 fields, as it was trained on, "
        "and cannot score these; a model for them starts with `shardrec spec infer ml/train.csv "
        "--label COLUMN`)"
    )
    ok(
        in_process(
            "spec", "infer", "ml/train.csv", "--label", "rating>=4", "--out", "ml.toml", cwd=trained
        )
    )

    lines = (trained / "raw" / "day_1").read_bytes().splitlines(keepends=True)[-50:]
    (trained / "extra.tsv").write_bytes(b"".join(line.rstrip(b"\n") + b"\tx\n" for line in lines))
    line = assert_one_line_error(
        in_process("predict", "model.safetensors", "extra.tsv", cwd=trained),
        r"^error: extra.tsv:1: row: 41 fields, schema has 40 \(too_many_fields\) \(the model reads rows "
        r"of 40 fields, as its training data had; if the extra ones are the last: `cut -f1-40 "
        r"extra.tsv > rows.txt` keeps the first 40\)$",
    )
    cut = line.split("`")[1]
    subprocess.run(cut, shell=True, cwd=trained, check=True)
    ok(in_process("predict", "model.safetensors", "rows.txt", "--out", "cut.txt", cwd=trained))
    assert len(np.loadtxt(trained / "cut.txt")) == 50

    assert_one_line_error(
        in_process("predict", "model.safetensors", "rows.txt", "--no-label", cwd=trained),
        r"^error: rows.txt:1: row: 40 fields, a row without its label has 39 \(too_many_fields\) "
        r"\(with --no-label: the rows have a label column; leave --no-label out\)$",
    )


@pytest.mark.slow
def test_data_preprocessed_otherwise_is_refused_by_predict_and_eval(trained: Path) -> None:
    """The same rows preprocessed with other table sizes or another dense transform give other
    inputs: scoring them would be wrong without a word."""
    if not (trained / "model.safetensors").is_file():
        ok(in_process("export", "run", "--out", "model.safetensors", cwd=trained))
    for out, flags in (
        ("data500", ["--max-ids", "500"]),
        ("raw_dense", ["--max-ids", "1000", "--dense-transform", "none"]),
    ):
        ok(in_process("preprocess", "raw/day_0", "raw/day_1", "--out", out, *flags, cwd=trained))
    assert_one_line_error(
        in_process("predict", "model.safetensors", "data500", cwd=trained),
        r"^error: data500: preprocessed with other settings than the model's training data \(cardinalities\[0\]: "
        r"1000 in training, 500 here, max_ids\[0\]: 1000 in training, 500 here\); preprocess it with the "
        r"training data's settings, or score its raw rows \(the model applies them\)$",
    )
    assert_one_line_error(
        in_process("predict", "model.safetensors", "raw_dense", cwd=trained),
        r"^error: raw_dense: preprocessed with other settings .*\(dense_transform: 'log1p' in training, "
        r"'none' here\)",
    )
    assert_one_line_error(
        in_process("eval", "run", "--data", "raw_dense", cwd=trained),
        r"^error: --data raw_dense: preprocessed with other settings than the data run trained on "
        r"\(dense_transform: 'log1p' in training, 'none' here\); preprocess it with the training data's settings$",
    )


def test_eval_of_a_run_that_trained_compiled_runs_eagerly_and_says_no_compile(
    trained: Path,
) -> None:
    """README: evaluation runs the dense layers eagerly. eval of a run of train.compile = "on" said
    "compiling the dense layers and the interaction (train.compile)" all the same."""
    copy = trained / "run-on"
    shutil.copytree(trained / "run", copy, dirs_exist_ok=True)
    config = copy / "config.toml"
    config.write_text(config.read_text().replace('compile = "auto"', 'compile = "on"', 1))
    assert 'compile = "on"' in config.read_text()
    done = ok(shardrec("eval", "run-on", "--split", "val", "--json", cwd=trained))
    assert "compil" not in done.stderr, done.stderr[-3000:]
    assert json.loads(done.stdout)["auc"] == _final(trained / "run", "val")["auc"]


@pytest.mark.slow
def test_dlrmv2_config_scaled_down_runs_end_to_end(trained: Path) -> None:
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
            cwd=trained,
        )
    )
    summary = json.loads(done.stdout)
    assert (
        summary["steps"] == 4
        and summary["target_auc"] == 0.80275
        and summary["target_reached"] is False
    )
    plan = json.loads((trained / "dlrmv2" / "plan.json").read_text())
    assert len(plan["tables"]) == 26
    # The on-the-fly multi-hot ids: the 100-hot feature's index table was drawn into the cache.
    assert any((trained / "cache").rglob("*.npy"))
    # 4 steps of 15 per epoch: evaluations every 5% of an epoch are every step; validation only,
    # test once at the end.
    evals = [(r["step"], r["split"]) for r in _records(trained / "dlrmv2") if r["kind"] == "eval"]
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
    log = read_log(trained / "dlrmv2" / "mllog.jsonl")
    val_aucs = [
        r["auc"]
        for r in _records(trained / "dlrmv2")
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
        values["eval_samples"] == Manifest.load(trained / "data").splits["val"].rows
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

    seed = load_job_config(trained / "dlrmv2" / "config.toml").train.seed
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
        for r in _records(trained / "dlrmv2")
        if r["kind"] == "eval" and r["split"] == "test"
    )
    again = json.loads(
        ok(
            shardrec(
                "eval", "dlrmv2", "--split", "test", "--nproc-per-node", "1", "--json", cwd=trained
            )
        ).stdout
    )
    assert again["world_size"] == 1 and again["auc"] == pytest.approx(test_auc, abs=1e-6)
    ok(in_process("export", "dlrmv2", "--out", "dlrmv2.safetensors", cwd=trained))
    assert (trained / "dlrmv2.safetensors").stat().st_size > 0


@pytest.mark.slow
def test_export_refuses_a_table_larger_than_memory_before_writing(
    trained: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardrec.trainer.inference.export import export_model

    # Trained with --data data from `trained`: config.toml keeps the path absolute, dataset.json as
    # typed too.
    assert (
        f'path = "{(trained / "data").resolve()}"' in (trained / "run" / "config.toml").read_text()
    )
    assert json.loads((trained / "run" / "dataset.json").read_text())["given"] == "data"
    monkeypatch.chdir(
        trained / "raw"
    )  # not where it trained: the absolute path still finds the data
    out = trained / "too_big.safetensors"
    with pytest.raises(
        ValueError,
        match=r"tensor sparse_arch\.embedding_bag_collection\.embedding_bags\.t_C\d+\.weight "
        r"takes 0\.00 GiB, more than the 0\.00 GiB of memory available here",
    ):
        export_model(trained / "run", out, memory_bytes=1000)
    assert not out.exists() and not list(trained.glob(".too_big*"))


@pytest.mark.slow
def test_export_of_a_run_whose_dataset_moved_takes_its_new_place(trained: Path) -> None:
    """The refusal names --data, and export has it: the same model file as from the old place."""
    if not (trained / "model.safetensors").is_file():
        ok(in_process("export", "run", "--out", "model.safetensors", cwd=trained))
    (trained / "data").rename(trained / "moved")
    try:
        assert_one_line_error(
            in_process("export", "run", "--out", "m.safetensors", cwd=trained),
            r"data.path = '.*/data' is not a directory here \(a relative path is taken from where "
            r"the command runs; pass --data DIR\)$",
        )
        ok(in_process("export", "run", "--out", "m.safetensors", "--data", "moved", cwd=trained))
    finally:
        (trained / "moved").rename(trained / "data")
    from safetensors import safe_open

    with (
        safe_open(str(trained / "m.safetensors"), framework="pt") as moved,
        safe_open(str(trained / "model.safetensors"), framework="pt") as before,
    ):
        assert sorted(moved.keys()) == sorted(before.keys())
        for key in before.keys():
            assert moved.get_tensor(key).equal(before.get_tensor(key)), key
        header, old = (json.loads(f.metadata()["shardrec"]) for f in (moved, before))
    assert header["model"] == old["model"] and header["tables"] == old["tables"]


def test_export_of_a_run_whose_data_changed_names_a_data_that_export_takes(trained: Path) -> None:
    """The run's data.path holding other data: the refusal says "to export" (it said "to
    evaluate"), and names --data of that path only where export would take it: data of other
    cardinalities is named as such, not offered to be refused a second time."""
    (trained / "data").rename(trained / "kept")
    data = trained / "data"
    changed = rf"^error: run was trained on other data than {data} now holds \(fingerprint "
    changed += r"[0-9a-f]{12}; the data there is [0-9a-f]{12}\)"
    try:
        days = ("raw/day_1", "raw/day_0")  # the same features of the same sizes, other rows
        ok(in_process("preprocess", *days, "--out", "data", "--max-ids", "1000", cwd=trained))
        assert_one_line_error(
            in_process("export", "run", "--out", "m2.safetensors", cwd=trained),
            rf"{changed}: to export on this data all the same, pass --data {data}$",
        )
        shutil.rmtree(data)
        days = ("raw/day_0", "raw/day_1")
        ok(in_process("preprocess", *days, "--out", "data", "--max-ids", "300", cwd=trained))
        assert_one_line_error(
            in_process("export", "run", "--out", "m2.safetensors", cwd=trained),
            rf"{changed}, and --data {data} would be refused too \(feature C1: 300 rows here, "
            r"1,000 rows in the data run trained on\): to export the run, pass "
            r"--data DIR naming the data it trained on \(or other data of its features and "
            r"cardinalities\)$",
        )
    finally:
        shutil.rmtree(data, ignore_errors=True)
        (trained / "kept").rename(data)
    assert not (trained / "m2.safetensors").exists()


VOCAB = ("--min-count", "3")


@pytest.fixture(scope="module")
def vocab_run(trained: Path) -> Path:
    """A run on vocabulary-mode data (kept as vdata.orig: tests that rebuild vdata copy it back),
    its model file, the probabilities of its test split (vsplit.npy) and the split's raw rows
    (vtest.tsv)."""
    ok(in_process("preprocess", "raw/day_0", "raw/day_1", "--out", "vdata", *VOCAB, cwd=trained))
    run = ("--out-dir", "vrun", "--steps", "4", *TINY[:-2])
    ok(shardrec("train", "--data", "vdata", *run, cwd=trained))
    ok(in_process("export", "vrun", "--out", "vocab.safetensors", cwd=trained))
    split = ("vocab.safetensors", "vdata", "--split", "test", "--out", "vsplit.npy")
    ok(in_process("predict", *split, cwd=trained))
    lines = (trained / "raw" / "day_1").read_bytes().splitlines(keepends=True)
    (trained / "vtest.tsv").write_bytes(b"".join(lines[-1000:]))
    shutil.copytree(trained / "vdata", trained / "vdata.orig")
    return trained


def _raw_rows_score_as_the_split(root: Path, model: str) -> None:
    ok(in_process("predict", model, "vtest.tsv", "--out", "vraw.txt", cwd=root))
    np.testing.assert_allclose(
        np.loadtxt(root / "vraw.txt"), np.load(root / "vsplit.npy"), atol=1e-6
    )


def _rebuild_vdata(root: Path) -> None:
    """vdata preprocessed again from the days the other way round: another vocabulary."""
    shutil.rmtree(root / "vdata", ignore_errors=True)
    ok(in_process("preprocess", "raw/day_1", "raw/day_0", "--out", "vdata", *VOCAB, cwd=root))


@pytest.mark.slow
def test_a_vocabulary_model_scores_raw_rows_as_its_split_after_its_dataset_is_rebuilt(
    vocab_run: Path,
) -> None:
    """Vocabulary mode (--min-count): raw rows get the ids of the vocabulary the model trained on,
    which the model file holds: the same probabilities as the preprocessed split, also once the
    dataset directory was preprocessed again from other days (another vocabulary: raw rows were
    looked up in it, ids past the tables' rows ended in torch's traceback) and once it is gone."""
    root = vocab_run
    try:
        _raw_rows_score_as_the_split(root, "vocab.safetensors")
        _rebuild_vdata(root)
        _raw_rows_score_as_the_split(root, "vocab.safetensors")
        shutil.rmtree(root / "vdata")
        _raw_rows_score_as_the_split(root, "vocab.safetensors")
    finally:
        shutil.rmtree(root / "vdata", ignore_errors=True)
        shutil.copytree(root / "vdata.orig", root / "vdata")


@pytest.mark.slow
def test_export_with_data_of_a_moved_vocabulary_dataset_holds_that_datasets_vocabulary(
    vocab_run: Path,
) -> None:
    """`export --data DIR` of a run whose dataset moved, while its old place holds other data (as
    the refusal of that export suggests): the file records DIR and holds DIR's vocabulary (it took
    the old place's: raw rows got another vocabulary's ids)."""
    root = vocab_run
    try:
        (root / "vdata").rename(root / "vmoved")
        _rebuild_vdata(root)
        ok(in_process("export", "vrun", "--out", "m.safetensors", "--data", "vmoved", cwd=root))
        _raw_rows_score_as_the_split(root, "m.safetensors")
        from safetensors import safe_open

        with safe_open(str(root / "m.safetensors"), framework="np") as f:
            header = json.loads(f.metadata()["shardrec"])
        assert header["transform"]["dataset"] == str((root / "vmoved").resolve())
    finally:
        shutil.rmtree(root / "vdata", ignore_errors=True)
        shutil.rmtree(root / "vmoved", ignore_errors=True)
        shutil.copytree(root / "vdata.orig", root / "vdata")


@pytest.mark.slow
def test_a_model_of_materialised_multi_hot_ids_scores_raw_rows_as_its_split(trained: Path) -> None:
    """Trained on a `data multihot` copy: raw rows are hashed as its one-hot source was and
    expanded by the same index tables (the split's probabilities), and the one-hot source itself
    is refused, not scored as if its ids were the model's."""
    sizes = "3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1"
    ok(in_process("data", "multihot", "data", "--out", "mh", "--sizes", sizes, "--cache",
                  "cache", cwd=trained))  # fmt: skip
    ok(
        shardrec(
            "train", "--config", str(REPO / "configs" / "dlrmv2.toml"), "--data", "mh",
            "--out-dir", "mat", "--nproc-per-node", "2", "--steps", "3",
            "--set", 'train.device="cpu"', "--set", "train.global_batch_size=128",
            "--set", "data.multihot_sizes=[]", "--set", "data.multihot_rows=[]",
            "--set", "model.embedding_dim=8", "--set", "model.dense_arch=[16, 8]",
            "--set", "model.over_arch=[32, 16, 1]", "--set", "model.dcn_low_rank=8",
            "--set", "train.mlperf_log=false", cwd=trained,
        )
    )  # fmt: skip
    ok(in_process("export", "mat", "--out", "mat.safetensors", cwd=trained))
    ok(in_process("predict", "mat.safetensors", "mh", "--out", "mh.npy", cwd=trained))
    lines = (trained / "raw" / "day_1").read_bytes().splitlines(keepends=True)
    (trained / "mat_rows.tsv").write_bytes(b"".join(lines[-1000:]))
    ok(in_process("predict", "mat.safetensors", "mat_rows.tsv", "--out", "mr.txt", cwd=trained))
    np.testing.assert_allclose(
        np.loadtxt(trained / "mr.txt"), np.load(trained / "mh.npy"), rtol=0, atol=1e-6
    )
    assert_one_line_error(
        in_process("predict", "mat.safetensors", "data", cwd=trained),
        r"^error: data: one-hot ids, the model was trained on multi-hot ids \(sizes \[3, 2, 1\]\.\.\., "
        r"seed 0\); score data made as its training data was, or raw rows$",
    )


@pytest.mark.slow
def test_predict_with_on_the_fly_multi_hot_names_a_multi_hot_copy_and_what_to_score(
    trained: Path,
) -> None:
    """A model that makes its multi-hot ids itself, given a `data multihot` copy: the line names
    the dataset, what made it multi-hot and what to score instead."""

    def on_the_fly(header: dict) -> None:
        header["transform"]["multihot"] = {"sizes": [2] * 26, "rows": None, "dist": "uniform",
                                           "seed": 0, "cache_dir": "cache"}  # fmt: skip

    _rewrite_header(_model_file(trained), trained / "fly.safetensors", on_the_fly)
    sizes = ",".join(["2"] * 26)
    ok(in_process("data", "multihot", "data", "--out", "mh2", "--sizes", sizes, "--cache",
                  "cache", cwd=trained))  # fmt: skip
    assert_one_line_error(
        in_process("predict", "fly.safetensors", "mh2", "--split", "test", cwd=trained),
        r"^error: mh2: feature C1 is already multi-hot \(a `shardrec data multihot` copy of "
        r"data\), and the model makes its multi-hot ids from one-hot ones \(trained with "
        r"data\.multihot_sizes\): score the one-hot dataset it was copied from, or raw rows$",
    )


def _model_file(trained: Path) -> Path:
    if not (trained / "model.safetensors").is_file():
        ok(in_process("export", "run", "--out", "model.safetensors", cwd=trained))
    return trained / "model.safetensors"


def _data500(trained: Path) -> Path:
    """The same rows preprocessed into tables of 500 rows (the run's have 1000)."""
    if not (trained / "data500").is_dir():
        flags = ["--out", "data500", "--max-ids", "500"]
        ok(in_process("preprocess", "raw/day_0", "raw/day_1", *flags, cwd=trained))
    return trained / "data500"


def _rewrite_header(model: Path, out: Path, edit) -> None:
    """`model`'s tensors under its header as `edit` changes it, written to `out`."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(model), framework="pt") as f:
        header = json.loads(f.metadata()["shardrec"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    edit(header)
    save_file(tensors, str(out), metadata={"shardrec": json.dumps(header, sort_keys=True)})


@pytest.mark.slow
def test_export_refuses_a_checkpoint_of_another_model_in_the_line_eval_does(trained: Path) -> None:
    """A checkpoint of run (tables of 1000 rows) put among the checkpoints of a run on data500
    (500 rows): eval refuses it, and export refuses it in the same line, writing nothing."""
    _data500(trained)
    small = settings('train.device="cpu"', *TINY_MODEL, f"train.global_batch_size={BATCH}")
    one_rank = ("--nproc-per-node", "1", "--steps", "2", *small)
    ok(shardrec("train", "--data", "data500", "--out-dir", "run500", *one_rank, cwd=trained))
    newest = sorted((trained / "run" / "checkpoints").glob("step-*"))[-1]
    # Under its own step's name (a folder named for another step is refused as such first), the
    # newest of run500's (2 steps).
    assert int(newest.name.split("-")[1]) > 2, newest
    shutil.copytree(newest, trained / "run500" / "checkpoints" / newest.name)
    line = assert_one_line_error(
        in_process("export", "run500", "--out", "foreign.safetensors", cwd=trained),
        rf"^error: run500/checkpoints/{newest.name}: checkpoint of another model, optimizer or "
        r"dataset: .*table t_C1 \[rows, dim\]: checkpoint \[1000, 8\], job \[500, 8\]",
    )
    assert not (trained / "foreign.safetensors").exists()
    evaluated = shardrec("eval", "run500", "--device", "cpu", "--nproc-per-node", "1", cwd=trained)
    assert evaluated.returncode == 1 and line in evaluated.stderr.splitlines(), evaluated.stderr


@pytest.mark.slow
def test_predict_refuses_a_model_file_whose_tensors_disagree_with_its_header(trained: Path) -> None:
    def fewer_rows(header: dict) -> None:
        (t_c1,) = [t for t in header["tables"] if t["name"] == "t_C1"]
        t_c1["rows"] = 500

    _rewrite_header(_model_file(trained), trained / "lying.safetensors", fewer_rows)
    assert_one_line_error(
        in_process("predict", "lying.safetensors", "data", cwd=trained),
        r"^error: lying.safetensors: tensor sparse_arch\.embedding_bag_collection\.embedding_bags\."
        r"t_C1\.weight is \[1000, 8\], its header's model needs \[500, 8\]; ",
    )


@pytest.mark.slow
def test_export_and_predict_replace_only_their_own_earlier_output(trained: Path) -> None:
    """--out over a file of the user's is refused and the file kept; over the command's own
    earlier output (a rerun) it is replaced."""
    _model_file(trained)
    notes = trained / "notes.txt"
    notes.write_text("notes\n")
    assert_one_line_error(
        in_process("export", "run", "--out", "notes.txt", cwd=trained),
        r"^error: --out notes.txt: exists and is not a model file of `shardrec export`, so it is "
        r"kept; give another file name, or remove it first$",
    )
    np.save(trained / "ints.npy", np.arange(3))
    for theirs in ("notes.txt", "ints.npy"):
        assert_one_line_error(
            in_process("predict", "model.safetensors", "data", "--out", theirs, cwd=trained),
            rf"^error: --out {theirs}: exists and is not a file of probabilities `shardrec "
            r"predict` wrote, so it is kept; give another file name, or remove it first$",
        )
    assert notes.read_text() == "notes\n" and np.load(trained / "ints.npy").tolist() == [0, 1, 2]
    ok(in_process("export", "run", "--out", "model.safetensors", cwd=trained))
    for ours in ("again.npy", "again.txt"):
        for _ in range(2):
            ok(in_process("predict", "model.safetensors", "data", "--out", ours, cwd=trained))


@pytest.mark.slow
def test_ctrl_c_during_export_ends_in_one_line_and_writes_nothing(
    trained: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    def pressed(*args, **kwargs):
        raise KeyboardInterrupt

    # Raised inside DCP's read, which wraps whatever its reads raise.
    monkeypatch.setattr(FileSystemReader, "read_data", pressed)
    done = in_process("export", "run", "--out", "stopped.safetensors", cwd=trained)
    assert done.exit_code == 130, (done.output, done.exception)
    assert done.stderr.strip() == (
        "interrupted: stopped.safetensors: nothing written; rerun the same command to export"
    )
    assert not list(trained.glob("*stopped.safetensors*"))


@pytest.mark.slow
def test_predict_refuses_input_without_rows(trained: Path) -> None:
    _model_file(trained)
    (trained / "empty.tsv").write_bytes(b"")
    with (trained / "empty.tsv.gz").open("wb") as f:
        f.write(gzip.compress(b""))
    for name, line in (
        ("empty.tsv", r"^error: empty.tsv: empty \(no rows\): nothing to score$"),
        ("empty.tsv.gz", r"^error: empty.tsv.gz: no rows: nothing to score$"),
    ):
        assert_one_line_error(
            in_process("predict", "model.safetensors", name, "--out", "o.txt", cwd=trained), line
        )
    assert not (trained / "o.txt").exists()


@pytest.mark.slow
def test_a_model_that_cannot_read_raw_rows_says_so_by_its_file_name(trained: Path) -> None:
    """A model of data without a text schema (as `data import-npy` makes): raw rows are refused
    naming the model file and what to score instead, and no refusal offers raw rows."""

    def imported(header: dict) -> None:
        del header["transform"]["schema"]

    _rewrite_header(_model_file(trained), trained / "npy.safetensors", imported)
    lines = (trained / "raw" / "day_1").read_bytes().splitlines(keepends=True)[-5:]
    (trained / "five.tsv").write_bytes(b"".join(lines))
    assert_one_line_error(
        in_process("predict", "npy.safetensors", "five.tsv", cwd=trained),
        r"^error: npy.safetensors: cannot read raw rows: .* score a preprocessed split of such "
        r"data instead: `shardrec predict npy.safetensors DATASET_DIR --split test`$",
    )
    _data500(trained)
    assert_one_line_error(
        in_process("predict", "npy.safetensors", "data500", cwd=trained),
        r"^error: data500: preprocessed with other settings .*; preprocess it with the training "
        r"data's settings$",
    )


@pytest.mark.slow
def test_eval_on_a_rank_count_the_batch_does_not_divide_names_those_it_does(trained: Path) -> None:
    assert_one_line_error(
        in_process("eval", "run", "--nproc-per-node", "3", "--device", "cpu", cwd=trained),
        rf"^error: the run's evaluation batch {BATCH} does not divide by 3 ranks \(eval.batch_size, "
        r"else train.global_batch_size\): use --nproc-per-node 1, 2, 4 or 8$",
    )


@pytest.mark.slow
def test_a_truncated_checkpoint_file_is_one_line_naming_it_in_export_and_eval(
    trained: Path,
) -> None:
    """A data file cut short before its digests were written (they match it): export and eval
    say which checkpoint and which of its files cannot be read and what to do, not torch's CheckpointException; export
    leaves no file at --out."""
    from shardrec.trainer.rundir.checkpoint.trust import write_digests

    shutil.copytree(trained / "run", trained / "cut")
    newest = sorted((trained / "cut" / "checkpoints").glob("step-*"))[-1]
    data = newest / "__0_0.distcp"
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 2)
    write_digests(newest)
    cut = (
        rf"^error: cut/checkpoints/{newest.name}: a file of this checkpoint is truncated or "
        r"unreadable \(__0_0\.distcp: RuntimeError: [^)]*\), "
    )
    line = assert_one_line_error(
        in_process("export", "cut", "--out", "cut.safetensors", cwd=trained),
        cut + r".*; export another checkpoint with --checkpoint STEP \(this run",
    )
    assert not list(trained.glob("*cut.safetensors*")), line
    evaluated = shardrec("eval", "cut", "--device", "cpu", "--nproc-per-node", "1", cwd=trained)
    assert evaluated.returncode == 1 and "Traceback" not in evaluated.stderr, evaluated.stderr
    # eval finds it before any rank starts (torch-free: the shard's length against .metadata).
    cut_early = cut.replace(r"RuntimeError: [^)]*", r"[\d,]+ bytes, \.metadata says [\d,]+")
    assert any(
        re.search(
            cut_early + r".*; evaluate or export another checkpoint with --checkpoint STEP", x
        )
        for x in evaluated.stderr.splitlines()
    ), evaluated.stderr
