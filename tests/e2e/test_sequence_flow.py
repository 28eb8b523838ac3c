"""HSTU on an event log end to end, as a user runs it: `shardrec synth --like yambda`,
`preprocess --events`, `train` on 2 CPU ranks with MLPerf DLRMv4's log, killed in the middle of a
window and resumed by torchrun bit for bit against an uninterrupted run, `eval` at another world
size, `export`, and `predict` on the raw event rows giving the held-out anchors the probabilities
the preprocessed split gets."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import assert_one_line_error, cli, settings, train_command
from mlperf_compliance import dlrmv4_compliance_errors, read_log

SPEC = """
[format]
kind = "parquet"

[items.artist]
file = "artist_item_mapping.parquet"
value = "artist_id"

[items.album]
file = "album_item_mapping.parquet"
value = "album_id"

[history]
length = 24
min_history = 8

[[crosses]]
name = "user_x_artist"
keys = ["uid", "artist"]
size = 1009
"""
GLOBAL_BATCH = 64
JOB = settings(
    'train.device="cpu"',
    'model.arch="hstu"',
    "model.embedding_dim=32",
    "model.hstu_layers=2",
    "model.hstu_heads=2",
    "model.hstu_qk_dim=16",
    "model.hstu_v_dim=16",
    "model.hstu_hidden=32",
    "model.hstu_max_seq_len=32",
    # configs/dlrmv4.toml's relative bias with its recency prior.
    'model.hstu_bias="pairwise"',
    "model.hstu_recency=0.3",
    'optim.dense="adam"',
    "optim.dense_lr=0.01",
    "optim.sparse_lr=0.01",
    "optim.adam_beta1=0.95",
    "optim.clip_grad_norm=1.0",
    "optim.warmup_steps=4",
    "optim.warmup_from_zero=true",
    "optim.schedule_tables=true",
    "optim.loss_weight=0.2",
    f"train.global_batch_size={GLOBAL_BATCH}",
    "train.steps=12",
    "train.mlperf_log=true",
    # Set: with mlperf_log an unset seed is drawn from the OS per run, and the straight run must
    # start where the killed one did.
    "train.seed=3",
    "checkpoint.interval_steps=5",
    'data.eval_splits=["val"]',
    "data.shuffle=false",
    "eval.every_epoch_fraction=0.05",
    'eval.fraction_rounding="round"',
    "eval.skip_until_fraction=0.03",
)


def _train(data: Path, run_dir: Path, *extra: str, fault: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SHARDREC_FAULT"}
    if fault:
        env["SHARDREC_FAULT"] = fault
    result = subprocess.run(
        train_command(data, run_dir, *JOB, *extra),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _final(run_dir: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ckpt = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    dcp_to_torch_save(ckpt, run_dir / "final.pt")
    state = torch.load(run_dir / "final.pt", weights_only=False)
    return {
        f"{part}.{k}": v
        for part in ("model", "fused_optim")
        for k, v in _flat(state[part])
        if isinstance(v, torch.Tensor)
    }


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flat(v, f"{prefix}{k}.")
    else:
        yield prefix, tree


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_hstu_on_an_event_log_trains_resumes_evaluates_exports_and_predicts(tmp_path: Path):
    cli("synth", tmp_path / "raw", "--like", "yambda", "--rows", "12000", "--seed", "4")
    (tmp_path / "raw" / "spec.toml").write_text(SPEC)
    data = tmp_path / "data"
    cli(
        "preprocess",
        tmp_path / "raw" / "events.parquet",
        "--events",
        tmp_path / "raw" / "spec.toml",
        "--out",
        data,
    )

    from shardrec.dataloader.event_loader import build_event_loader

    stream = build_event_loader(data, "train", global_batch_size=GLOBAL_BATCH, rank=0, world_size=1)
    # Killed after step 7, resumed from the checkpoint of step 5: inside a window.
    assert stream.window_of(4) == stream.window_of(5)
    killed = _train(data, tmp_path / "killed", "--max-restarts", "1", fault="kill:7:1:0")
    assert json.loads(killed.stdout)["resumed_from_step"] == 5
    _train(data, tmp_path / "straight", "--plan", tmp_path / "killed" / "plan.json")
    a, b = _final(tmp_path / "killed"), _final(tmp_path / "straight")
    assert a.keys() == b.keys() and any("embedding_collection" in k for k in a)
    for key, value in a.items():
        assert torch.equal(value, b[key]), f"{key} differs after the resume"
    finals = [
        [
            {k: v for k, v in r.items() if k != "seconds"}
            for r in _records(tmp_path / run)
            if r["kind"] == "eval" and r["final"]
        ]
        for run in ("killed", "straight")
    ]
    assert finals[0] == finals[1] and finals[0][0]["split"] == "val"
    val_auc = finals[0][0]["auc"]

    # MLPerf DLRMv4's log of the uninterrupted run, as the closed rules check it (this run's own
    # sizes: the rules' figures are Yambda-5b's).
    log = read_log(tmp_path / "straight" / "mllog.jsonl")
    values = {r["key"]: r["value"] for r in log}
    assert values["submission_benchmark"] == "dlrmv4" and values["max_sequence_length"] == 32
    assert values["train_samples"] == stream.num_samples
    interval = max(1, round(0.05 * (stream.num_samples // GLOBAL_BATCH))) * GLOBAL_BATCH
    first = -(-int(0.03 * stream.num_samples) // interval) * interval
    assert (
        dlrmv4_compliance_errors(
            log,
            train_samples=stream.num_samples,
            eval_samples=values["eval_samples"],
            interval_samples=interval,
            first_eval_samples=first,
            target=min(r["value"] for r in log if r["key"] == "eval_accuracy"),
        )
        == []
    )

    # eval at another world size gives the run's own AUC.
    again = cli("eval", tmp_path / "straight", "--split", "val", "--nproc-per-node", "1", "--json")
    assert json.loads(again.stdout)["auc"] == pytest.approx(val_auc, abs=1e-6)

    # export; predict on the val split and on the raw log agree on the held-out anchors.
    model = tmp_path / "model.safetensors"
    cli("export", tmp_path / "straight", "--out", model)
    scored = cli(
        "predict", model, data, "--split", "val", "--out", tmp_path / "split.txt", "--json"
    )
    # An HSTU model scores a split 128 rows at a time, as raw event rows: the 8,192 of a DLRM's
    # split held ~16 GB of attention scores at configs/dlrmv4.toml's sizes.
    assert json.loads(scored.stdout)["batch_size"] == 128
    # Users no training step brought score with their row's initial weights: predict counts the
    # split's samples of them (before: not a word), and cannot score them as missing values.
    train = build_event_loader(data, "train", global_batch_size=GLOBAL_BATCH, rank=0, world_size=1)
    seen = {
        u
        for b in itertools.islice(iter(train), 12)
        for u in b.sparse_features["uid"].values().tolist()
    }
    held_out = build_event_loader(
        data, "val", global_batch_size=GLOBAL_BATCH, rank=0, world_size=1, tail="pad"
    )
    users = [
        u
        for b in held_out
        for u, label in zip(b.sparse_features["uid"].values().tolist(), b.labels.tolist())
        if label >= 0
    ]
    unseen = sum(u not in seen for u in users)
    assert 0 < unseen < len(users)
    assert json.loads(scored.stdout)["untrained"]["t_uid"] == {
        "lookups": len(users),
        "untrained": unseen,
    }
    assert_one_line_error(
        cli("predict", model, data, "--split", "val", "--untrained-as-missing", ok=False),
        rf"^error: --untrained-as-missing: {re.escape(str(model))} is an event log's model, whose "
        "users and items are rows of their tables with no missing-value row; leave the events of "
        "users it never trained on out instead$",
    )
    cli("predict", model, tmp_path / "raw" / "events.parquet", "--out", tmp_path / "raw.txt")
    on_split, on_raw = np.loadtxt(tmp_path / "split.txt"), np.loadtxt(tmp_path / "raw.txt")
    # --no-label: the same probabilities, no AUC.
    raw = tmp_path / "raw" / "events.parquet"
    unlabeled = cli("predict", model, raw, "--no-label", "--out", tmp_path / "nl.txt", "--json")
    assert json.loads(unlabeled.stdout)["auc"] is None
    assert (tmp_path / "nl.txt").read_bytes() == (tmp_path / "raw.txt").read_bytes()
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(raw).drop_columns(["played_ratio_pct"]), tmp_path / "nr.parquet")
    assert_one_line_error(
        cli("predict", model, tmp_path / "nr.parquet", ok=False),
        r"column 'played_ratio_pct' not found \(columns: .*\); the model's event spec reads "
        "events.played_ratio from it: score a log with the columns of the log the model was "
        "trained on$",
    )
    # A user the model has no row for (a later log's new one): its first row, and what to do.
    # Before: "nu.parquet: uid: user 48 is beyond the model's 48 users": no row, nothing to do.
    from shardrec.trainer.inference.model_file import read_header

    (users,) = [t["rows"] for t in read_header(model)["tables"] if t["name"] == "t_uid"]
    log = pq.read_table(raw)
    uid = log["uid"].to_numpy().copy()
    first = int(np.flatnonzero(uid == uid.max())[0])
    uid[uid == uid.max()] = users
    pq.write_table(
        log.set_column(log.schema.get_field_index("uid"), "uid", pa.array(uid, log["uid"].type)),
        tmp_path / "nu.parquet",
    )
    assert_one_line_error(
        cli("predict", model, tmp_path / "nu.parquet", ok=False),
        rf"^error: {re.escape(str(tmp_path / 'nu.parquet'))}: row {first}: uid: {users} is beyond "
        rf"the model's {users:,} users \(0 to {users - 1:,}\), who each have a row of its user "
        "table: leave that user's events out, or score them with a model trained on a log that "
        "holds the user$",
    )
    from shardrec.dataloader.events.event_batches import EventSource
    from shardrec.dataloader.spec.event_spec_file import load_event_spec
    from shardrec.tools.preprocess.events.event_log import read_event_log

    spec_path = tmp_path / "raw" / "spec.toml"
    log_rows = read_event_log(
        [tmp_path / "raw" / "events.parquet"], load_event_spec(spec_path), spec_path
    )
    val = EventSource(data, "val")
    _, users, places = val.timeline
    rows = log_rows.row[log_rows.offsets[users] + places]
    assert len(rows) == len(on_split) > 0
    np.testing.assert_allclose(on_raw[rows], on_split, rtol=0, atol=1e-7)
