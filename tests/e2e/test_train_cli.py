"""`shardrec train` end to end on 2 CPU ranks through torchrun: a rank SIGKILLed mid-epoch named
in the last line, then bitwise-exact resume after it and after a SIGKILL during a save (torchrun
restarting the group, --max-restarts), checked against an uninterrupted run over the two-node
loopback rendezvous, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import (
    TINY_MODEL,
    assert_one_line_error,
    run_direct_rank,
    settings,
    tensorboard_scalars,
    torchelastic_folders,
    train_command,
)
from typer.testing import CliRunner

from shardrec.tools.cli.app import app

JOB = settings(
    'train.device="cpu"',  # CPU ranks (gloo) even on a GPU host: 2 ranks must not need 2 GPUs
    *TINY_MODEL,
    "train.global_batch_size=64",
    "train.epochs=2",
    "checkpoint.interval_steps=4",
    "train.log_interval=5",  # log lines between checkpoints: a resume continues a line's loss
    "eval.interval_steps=10",
    "checkpoint.keep=3",
    'data.eval_splits=["val"]',
    'train.pipeline="sparse_dist"',  # the default on CUDA, the harder path to resume
)


def _train(
    data: Path, run_dir: Path, *extra: str, fault: str = "", tmpdir: Path | None = None
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SHARDREC_FAULT"}
    if tmpdir is not None:
        env["TMPDIR"] = str(tmpdir)
    if fault:
        env["SHARDREC_FAULT"] = fault
    cmd = train_command(data, run_dir, *JOB, *extra)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def _final(run_dir: Path) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    ckpt = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    dcp_to_torch_save(ckpt, run_dir / "final.pt")
    return torch.load(run_dir / "final.pt", weights_only=False)


def _assert_bitwise(a: dict, b: dict, what: str) -> None:
    for part in ("model", "fused_optim"):
        flat_a = {k: v for k, v in _flatten(a[part])}
        flat_b = {k: v for k, v in _flatten(b[part])}
        assert flat_a.keys() == flat_b.keys(), what
        for key, value in flat_a.items():
            assert torch.equal(value, flat_b[key]), f"{what}: {part} {key} differs"


def _flatten(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flatten(v, f"{prefix}{k}.")
    elif isinstance(tree, torch.Tensor):
        yield prefix, tree


def _final_eval(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if k != "seconds"}
        for r in records
        if r["kind"] == "eval" and r["final"]
    ]


@pytest.mark.slow
def test_sigkill_resume_is_bitwise_and_two_nodes_match(tiny_dataset: Path, tmp_path: Path) -> None:
    # Rank 1 SIGKILLed after step 10: the last line names it and how it died (rank 0, whose
    # collective then fails, is no suspect), and the rerun resumes from step 8. That rerun is
    # SIGKILLed while saving step 16, after the shards are written and before the rename: torchrun
    # restarts the group (--max-restarts), which must ignore that half-made checkpoint and resume
    # from 12. Each run leaves nothing of torchrun's agent in the temporary directory.
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    killed = _train(tiny_dataset, tmp_path / "killed", fault="kill:10:1:0", tmpdir=tmpdir)
    assert killed.returncode == 1
    step8 = tmp_path / "killed" / "checkpoints" / "step-00000008"
    assert killed.stderr.strip().splitlines()[-1] == (
        "error: training failed: rank 1 was killed by SIGKILL (signal 9); the kernel's OOM killer "
        f"does this when memory runs out; the newest complete checkpoint, {step8} (step 8), is "
        "kept and a re-run resumes from it"
    ), killed.stderr[-3000:]
    assert "Traceback" not in killed.stderr, killed.stderr[-3000:]
    assert torchelastic_folders(tmpdir) == [], "a failed run left torchrun's log folder"
    faulty = _train(
        tiny_dataset,
        tmp_path / "killed",
        "--max-restarts",
        "1",
        fault="kill_in_save:16::0",
        tmpdir=tmpdir,
    )
    assert faulty.returncode == 0, faulty.stderr[-3000:]
    summary = json.loads(faulty.stdout)
    # Steps 13-30 of the attempt that finished, all through torchrec's pipeline.
    assert summary["resumed_from_step"] == 12
    assert summary["pipeline"] == {"TrainPipelineSparseDist": 18}
    resumes = [
        json.loads(line)
        for line in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in resumes if r["kind"] == "resume"] == [8, 12]
    # Steps 10 and 15, written again after each resume, are each one point in TensorBoard.
    scalars = tensorboard_scalars(tmp_path / "killed")
    assert [step for step, _ in scalars["train/loss"]] == [5, 10, 15, 20, 25, 30]
    assert [step for step, _ in scalars["eval/val/auc"]] == [10, 20, 30]
    remaining = sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir())
    assert remaining == ["step-00000024", "step-00000028", "step-00000030"]

    # The uninterrupted reference: two torchrun "nodes" of one rank each, rendezvous over
    # loopback, on the plan the killed run made. The same model from both, bit for bit, says
    # that the killed run resumed exactly and that two nodes train as one node of two ranks.
    from shardrec.trainer.distributed.launch import torchrun_command
    from shardrec.trainer.distributed.local_ranks import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    args = [
        "--data",
        str(tiny_dataset),
        "--out-dir",
        str(tmp_path / "nodes"),
        "--plan",
        str(tmp_path / "killed" / "plan.json"),
        *JOB,
    ]
    nodes = [
        subprocess.Popen(
            torchrun_command(args, 1, nnodes=2, rdzv_endpoint=endpoint),
            # One thread per rank, as `shardrec train` gives two ranks on this host (launch.py):
            # torchrun leaves a node of one rank all the cores, and two such ranks spin on each
            # other's.
            env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmpdir)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    assert torchelastic_folders(tmpdir) == [], "a restarted or multi-node run left its log folder"
    summary = json.loads((tmp_path / "nodes" / "summary.json").read_text())
    assert (
        summary["steps"] == 30
        and summary["resumed_from_step"] is None
        and summary["eval"]["val"]["auc"] > 0.6
    )
    _assert_bitwise(
        _final(tmp_path / "killed"),
        _final(tmp_path / "nodes"),
        "run killed twice against two nodes",
    )
    assert _final_eval(tmp_path / "killed") == _final_eval(tmp_path / "nodes")
    # Every logged training loss, the killed attempts' lines included: those of resumed steps are
    # written again, with the uninterrupted run's values bit for bit.
    nodes = {r["step"]: r["loss"] for r in _train_losses(tmp_path / "nodes")}
    killed = _train_losses(tmp_path / "killed")
    assert sorted(nodes) == list(range(5, 31, 5))
    assert len(killed) > len(nodes) and all(r["loss"] == nodes[r["step"]] for r in killed)


def _train_losses(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "train"]


runner = CliRunner()


def test_train_data_errors_name_the_flag_as_typed(tiny_dataset: Path, tmp_path: Path) -> None:
    # Before: 'nowhere: does not exist', as if of no flag.
    missing, file = tmp_path / "nowhere", tiny_dataset / "manifest.json"
    out = ["--out-dir", str(tmp_path / "run")]
    for flag, data, said in (
        ("--data", missing, "does not exist"),
        ("--data", file, "not a directory"),
        ("--continue-on", missing, "does not exist"),
    ):
        result = runner.invoke(app, ["train", flag, str(data), *out])
        assert_one_line_error(result, "^" + re.escape(f"error: {flag} {data}: {said}") + "$")
    job = tmp_path / "job.toml"
    job.write_text(f"[data]\npath = '{missing}'\n")
    result = runner.invoke(app, ["train", "--config", str(job), *out])
    assert_one_line_error(
        result, "^" + re.escape(f"error: {job}:2: data.path = '{missing}': does not exist") + "$"
    )


def test_a_job_files_relative_path_that_names_nothing_says_where_it_was_read_from(
    tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job file beside its data (`path = "../data"`) read from another directory: relative
    paths are taken from where the command runs. Before, the plan's refusal named neither the job
    file nor its key ('../plan.json: cannot read plan file: No such file or directory')."""
    monkeypatch.chdir(tmp_path)
    job = Path("jobs") / "job.toml"
    job.parent.mkdir()
    where = f"(a relative path is taken from where the command runs, {tmp_path})"
    for toml, said in (
        ("[data]\npath = '../data'\n", "2: data.path = '../data': does not exist"),
        (
            f"[data]\npath = '{tiny_dataset}'\n[sharding]\nplan = '../plan.json'\n"
            "[train]\nglobal_batch_size = 64\n",
            "4: sharding.plan = '../plan.json': cannot read plan file: No such file or directory",
        ),
    ):
        job.write_text(toml)
        result = runner.invoke(app, ["train", "--config", str(job), "--out-dir", "run"])
        assert_one_line_error(result, "^" + re.escape(f"error: {job}:{said} {where}") + "$")


def test_bad_input_is_one_clear_line(tiny_dataset: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["train", "--data", str(tiny_dataset), "--set", "train.bogus=1"])
    assert_one_line_error(result, re.escape("unknown key train.bogus"))
    result = runner.invoke(app, ["train", "--data", str(tmp_path / "nowhere")])
    assert_one_line_error(result, re.escape("nowhere"))
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for out_dir in (a_file, a_file / "run"):  # was "cannot lock the run directory: File exists"
        result = runner.invoke(
            app,
            ["train", "--data", str(tiny_dataset), "--out-dir", str(out_dir)]
            + ["--set", "train.global_batch_size=64"],
        )
        assert_one_line_error(
            result,
            "^"
            + re.escape(
                f"error: --out-dir {out_dir}: {a_file} is a file, not a folder; give a folder for "
                "the run (a new one, or a run's to resume it)"
            )
            + "$",
        )
    assert a_file.read_text() == "mine"
    result = runner.invoke(
        app,
        [
            "train",
            "--data",
            str(tiny_dataset),
            "--nproc-per-node",
            "3",
            "--set",
            "train.global_batch_size=64",
        ],
    )
    assert_one_line_error(
        result,
        "^"
        + re.escape(
            "error: --set 'train.global_batch_size=64': train.global_batch_size = 64 does not "
            "divide by --nproc-per-node 3"
        )
        + "$",
    )

    # A plan made for 2 ranks, used with 1: the message names what differs.
    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.embeddings.tables import build_table_configs
    from shardrec.sharding.plan.plan_file import plan_fingerprint, save_plan
    from shardrec.sharding.plan.plan_types import PLAN_SCHEMA_VERSION, PlanFile, Shard, TablePlan

    tables = build_table_configs(Manifest.load(tiny_dataset), 16)
    plan = PlanFile(
        PLAN_SCHEMA_VERSION,
        plan_fingerprint(tables, 2, 64, "cpu"),
        [
            TablePlan(t.name, "table_wise", "fused", [Shard(0, 0, 0, t.num_embeddings, 16)])
            for t in tables
        ],
    )
    save_plan(plan, tmp_path / "plan.json")
    result = runner.invoke(
        app,
        [
            "train",
            "--data",
            str(tiny_dataset),
            "--plan",
            str(tmp_path / "plan.json"),
            "--set",
            "train.global_batch_size=64",
            "--set",
            'train.device="cpu"',
        ],
    )
    assert_one_line_error(result, re.escape("world size: plan 2, job 1"))


def test_failed_ranks_end_in_one_line_not_torchruns_traceback(tmp_path: Path) -> None:
    from shardrec.trainer.distributed.launch import torchrun_command

    # A "rank" that fails at once (json.tool on a missing file, exit code 2) stands in for the
    # trainer.
    result = subprocess.run(
        torchrun_command(["/nonexistent.json"], 1, module="json.tool"),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == "torchrun: rank 0 failed first (exit code 2)"
    assert "Traceback" not in result.stderr and "ChildFailedError" not in result.stderr
    assert torchelastic_folders(tmp_path) == [], "torchrun's agent left its log folder"


def test_a_global_batch_larger_than_every_event_window_is_refused_before_the_ranks_start(
    tmp_path: Path,
) -> None:
    from helpers import cli

    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.dataloader.spec.event_spec_file import load_event_spec
    from shardrec.tools.preprocess.events.event_dataset import build_event_dataset
    from shardrec.tools.synth.yambda import write_yambda_like

    write_yambda_like(tmp_path, 3_000, seed=1)
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[items.artist]\nfile = "artist_item_mapping.parquet"\nvalue = "artist_id"\n'
        "[history]\nlength = 12\nmin_history = 4\n[split]\nwindow_seconds = 3600\n"
    )
    data = tmp_path / "ev"
    build_event_dataset([tmp_path / "events.parquet"], load_event_spec(spec), spec, data)
    events = Manifest.load(data).events
    offsets = events["windows"]["train"]
    largest = max(b - a for a, b in zip(offsets, offsets[1:]))
    batch = 2 * (largest + 1)  # more than any window, fewer than the split's samples
    assert batch < offsets[-1]
    job = ["--data", data, "--out-dir", tmp_path / "run"]
    job += ["--set", 'train.device="cpu"', "--set", 'model.arch="hstu"']
    job += ["--set", 'data.eval_splits=["val"]', "--set", f"train.global_batch_size={batch}"]
    result = cli("train", *job, "--nproc-per-node", "2", ok=False)
    line = assert_one_line_error(
        result,
        rf"^error: --set 'train.global_batch_size={batch}': train.global_batch_size = {batch} is "
        rf"more samples than any window of {re.escape(str(data))}'s split 'train' has \(the "
        rf"largest has {largest}; {offsets[-1]:,} in {len(offsets) - 1} windows\), so no step "
        rf"trains with data.tail = 'drop': set it to at most {largest}, data.tail = \"pad\", or "
        r"longer windows \(\[split\] window_seconds of the event spec\)$",
    )
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    # The rank program torchrun starts on every node (the README's multi-node path), with no
    # `shardrec train` before it: the same line, before the rank joins any group.
    direct = run_direct_rank(*map(str, job))
    assert assert_one_line_error(direct, "^error: ") == line
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
    # Padded, each window gives a batch: the same job is accepted (checked, not trained).
    from shardrec.trainer.job.flags import job_from_flags
    from shardrec.trainer.job.preflight import preflight

    settings_ = [f"train.global_batch_size={batch}", 'model.arch="hstu"', 'train.device="cpu"']
    settings_ += ['data.eval_splits=["val"]', 'data.tail="pad"']
    preflight(job_from_flags(None, data, None, None, settings_), 2)


@pytest.mark.slow
def test_a_data_parallel_table_trains_without_torchs_autograd_warning(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    """fbgemm's dense (data-parallel) lookup makes torch warn that backprop through it "may lead
    to silently incorrect behavior"; its gradients are right (tests/distributed/
    test_train_distributed.py: data-parallel tables end as table-wise ones), so the user sees no
    such line, and the table still learns."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    run = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardrec.tools.cli",
            "train",
            "--data",
            str(tiny_dataset),
            "--out-dir",
            str(run),
            "--steps",
            "4",
            *settings(
                'train.device="cpu"',
                *TINY_MODEL,
                "train.global_batch_size=64",
                "checkpoint.interval_steps=2",
                'sharding.constraints={t_f0={sharding_types=["data_parallel"]}}',
            ),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "silently incorrect" not in done.stderr and "Warning" not in done.stderr, done.stderr
    plan = json.loads((run / "plan.json").read_text())
    assert "data_parallel" in json.dumps(plan), "t_f0 was not data-parallel"
    tables = []
    for step in (2, 4):
        dcp_to_torch_save(run / "checkpoints" / f"step-{step:08d}", tmp_path / f"{step}.pt")
        model = torch.load(tmp_path / f"{step}.pt", weights_only=False)["model"]
        (key,) = [k for k in model if "t_f0" in k and k.endswith("weight")]
        tables.append(model[key])
    assert not torch.equal(tables[0], tables[1]), "the data-parallel table did not change"


@pytest.mark.slow
def test_the_logged_rate_is_each_steps_own_and_a_changed_rate_applies_on_resume(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    """metrics.jsonl's `lr` at step N is the dense rate step N took (it was step N+1's: the peak a
    step early), and a resume that accepts a new optim.dense_lr trains at it from the schedule's
    step on (it went on at the checkpoint's rate)."""
    run = tmp_path / "run"
    job = (
        'train.device="cpu"',
        *TINY_MODEL,
        "train.global_batch_size=64",
        "train.log_interval=1",
        "checkpoint.interval_steps=2",
        "eval.interval_steps=0",
        "optim.warmup_steps=4",
    )

    def train(steps: int, *extra: str) -> None:
        args = ["train", "--data", str(tiny_dataset), "--out-dir", str(run), "--steps", str(steps)]
        done = subprocess.run(
            [sys.executable, "-m", "shardrec.tools.cli", *args, *settings(*job), *extra],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]

    train(2)
    train(4, "--set", "optim.dense_lr=0.5", "--allow-change", "optim.dense_lr")
    rates = [(r["step"], round(r["lr"], 6)) for r in _train_losses(run)]
    assert rates == [(1, 0.0125), (2, 0.025), (3, 0.375), (4, 0.5)]
