"""`shardrec runs` and the status it shows of a run directory (trainer/rundir/life/run_state.py):
complete, stopped, running, damaged, and the best AUC of the split asked for, of the evaluations
a run still stands on. A run directory's other rules: test_run_lifecycle_rules.py."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from helpers import cli
from run_dirs import job_config, run_dir_as_left

from shardrec.trainer.rundir.life.run_state import (
    best_auc,
    find_runs,
    read_run_dir,
    run_status,
    stopped_message,
)
from shardrec.trainer.rundir.life.stretches import Stretch, write_stretches


def test_the_status_of_a_run(tiny_dataset: Path, tmp_path: Path) -> None:
    config = job_config(tiny_dataset)
    run = run_dir_as_left(tmp_path, config, 15, {"steps": 15})
    assert run_status(read_run_dir(run)) == "complete"
    (run / "summary.json").unlink()
    assert run_status(read_run_dir(run)) == "running"  # metrics written just now, no lock file
    old = time.time() - 600
    os.utime(run / "metrics.jsonl", (old, old))
    assert run_status(read_run_dir(run)) == "failed"
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "stop", "step": 15}) + "\n")
    os.utime(run / "metrics.jsonl", (old, old))
    assert run_status(read_run_dir(run)) == "stopped"
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "resume", "step": 15}) + "\n")
    os.utime(run / "metrics.jsonl", (old, old))
    assert run_status(read_run_dir(run)) == "failed"  # resumed after the stop, then died
    (run / ".lock").write_text("")
    assert run_status(read_run_dir(run), active_seconds=1e9) == "failed"  # nobody holds it
    assert stopped_message(1234) == (
        "stopped at step 1,234; checkpoint written; rerun the same command to resume"
    )


def test_runs_lists_a_run_whose_newest_checkpoint_fails_its_digests_as_damaged(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    """A complete run whose newest checkpoint was changed since its save is no longer listed as
    complete: train, eval and export of it are refused. Like `train` before it starts ranks,
    `runs` hashes all but the bulky shards, and finds a shard gone."""
    import torch

    from shardrec.trainer.rundir.checkpoint.trust import write_digests

    run = run_dir_as_left(tmp_path, job_config(tiny_dataset), 15, {"steps": 15})
    checkpoint = run / "checkpoints" / "step-00000015"
    torch.save({"progress": {"step": 15}}, checkpoint / "train_state.pt")  # readable, as saved
    saved = (checkpoint / "train_state.pt").read_bytes()
    (checkpoint / "__0_0.distcp").write_bytes(b"saved")
    write_digests(checkpoint)
    old = time.time() - 600  # not running: no job wrote metrics lately
    os.utime(run / "metrics.jsonl", (old, old))
    assert json.loads(cli("runs", run, "--json").stdout)[0]["status"] == "complete"
    (checkpoint / "train_state.pt").write_bytes(b"later")
    assert json.loads(cli("runs", run, "--json").stdout)[0]["status"] == "damaged"
    assert cli("runs", run).stdout.splitlines()[-1] == (
        f"damaged: {checkpoint / 'train_state.pt'}: contents differ from the digest written at "
        "save time (changed since); refusing the checkpoint"
    )
    (checkpoint / "train_state.pt").write_bytes(saved)
    (checkpoint / "__0_0.distcp").unlink()
    assert cli("runs", run).stdout.splitlines()[-1] == (
        f"damaged: {checkpoint / '__0_0.distcp'}: listed in digests.json but missing; "
        "refusing the checkpoint"
    )


def test_runs_best_auc_leaves_out_evaluations_a_rerun_went_back_past(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    # Killed after its evaluation of step 30 and before the checkpoint of step 40: a rerun resumes
    # from step 20 (here with another learning rate), so step 30's model exists no more.
    killed = [
        {"kind": "eval", "split": "val", "step": 20, "auc": 0.7465},
        {"kind": "eval", "split": "val", "step": 30, "auc": 0.7985},
    ]
    run = run_dir_as_left(tmp_path, job_config(tiny_dataset), 20, None, killed)
    old = time.time() - 600
    os.utime(run / "metrics.jsonl", (old, old))
    # Failed at step 20: a rerun goes on from the checkpoint of step 20 and its AUC.
    assert json.loads(cli("runs", run, "--json").stdout)[0]["best_val_auc"] == 0.7465
    rerun = [
        {"kind": "resume", "step": 20},
        {"kind": "eval", "split": "val", "step": 30, "auc": 0.7630},
        {"kind": "eval", "split": "val", "step": 40, "auc": 0.7718},
    ]
    with open(run / "metrics.jsonl", "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rerun))
    assert best_auc(run) == 0.7718
    shutil.move(run / "checkpoints" / "step-00000020", run / "checkpoints" / "step-00000040")
    (run / "summary.json").write_text(json.dumps({"steps": 40}))
    assert json.loads(cli("runs", run, "--json").stdout)[0]["best_val_auc"] == 0.7718


def test_runs_are_found_under_a_folder_but_not_inside_checkpoints(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "config.toml").write_text("")
    (tmp_path / "b" / "checkpoints" / "step-00000001").mkdir(parents=True)
    (tmp_path / "b" / "checkpoints" / "step-00000001" / "config.toml").write_text("")
    (tmp_path / "c").mkdir()
    assert find_runs(tmp_path) == [tmp_path / "a", tmp_path / "b"]


def test_the_best_auc_is_of_the_split_asked_for(tmp_path: Path) -> None:
    assert best_auc(tmp_path) is None
    records = [
        {"kind": "eval", "split": "val", "step": 1, "auc": 0.70},
        {"kind": "eval", "split": "test", "step": 1, "auc": 0.90},
        {"kind": "eval", "split": "val", "step": 2, "auc": 0.75},
        {"kind": "eval", "split": "val", "step": 3, "auc": 0.72},
        {"kind": "train", "split": "val", "step": 3, "auc": 0.99},
        {"kind": "eval", "split": "val", "step": 4, "auc": None},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert best_auc(tmp_path) == 0.75 and best_auc(tmp_path, "test") == 0.90


def test_runs_shows_no_best_auc_for_evaluations_without_one(tiny_dataset: Path, tmp_path: Path):
    # A val split whose labels are all of one class has no AUC (NaN): `runs` showed "nan" as the
    # best, and NaN in --json, which is no JSON number (jq refuses it).
    nan = float("nan")
    evals = [{"kind": "eval", "split": "val", "step": s, "auc": nan} for s in (10, 20)]
    run = run_dir_as_left(tmp_path, job_config(tiny_dataset), 20, {"steps": 20}, evals)
    shown = cli("runs", run, "--json").stdout
    assert "NaN" not in shown and json.loads(shown)[0]["best_val_auc"] is None
    assert "nan" not in cli("runs", run).stdout.lower()  # the table shows "-"


def test_runs_best_auc_of_a_run_that_went_on_is_its_current_stretchs(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    # A day-by-day run (--continue-on) evaluates each day on its own val split; `runs` showed the
    # best of all days', 0.8100 (day 0's model on day 0's val), beside a model whose AUC on the
    # data it trains on now is 0.6200.
    evals = [
        {"kind": "eval", "split": "val", "step": 10, "auc": 0.81},
        {"kind": "stretch", "step": 10, "stretch": 1, "data": "days/1"},
        {"kind": "eval", "split": "val", "step": 20, "auc": 0.58},
        {"kind": "eval", "split": "val", "step": 30, "auc": 0.62},
    ]
    run = run_dir_as_left(tmp_path, job_config(tiny_dataset), 30, {"steps": 30}, evals)
    write_stretches(run, [Stretch(0, "/days/0", "", 0, 10), Stretch(1, "/days/1", "", 10, 30)])
    assert json.loads(cli("runs", run, "--json").stdout)[0]["best_val_auc"] == 0.62
