"""Job settings and pre-launch checks refuse bad input with one line naming the key and value;
a resume that changes the optimizers is refused; samples/s counts training time only."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardrec.trainer.job.config import load_job_config
from shardrec.trainer.job.flags import job_from_flags
from shardrec.trainer.job.preflight import check_trainable, preflight


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.log_interval=0", "train.log_interval = 0"),
        ("train.seed=-2", "train.seed = -2 must be >= 0"),
        ("eval.interval_steps=-1", "eval.interval_steps = -1"),
        ("eval.batch_size=-64", "eval.batch_size = -64"),
        ("eval.max_batches=-1", "eval.max_batches = -1"),
        ("checkpoint.interval_steps=-5", "checkpoint.interval_steps = -5"),
        ("optim.eps=0", "optim.eps = 0.0"),
        ("optim.eps=-1e-8", "optim.eps = -1e-08"),
        ('model.dense_arch=["a", 16]', "'a' should be an integer"),
        ("model.over_arch=[0, 1]", "layer size 0"),
        ("model.dims={C1=0}", "model.dims.C1 = 0"),
        ('model.dims={C1="x"}', "'x' should be an integer"),
        ("model.dims={C1=8}", "DLRM's dot interaction"),
        ("data.eval_splits=[1]", "should be a string"),
        (
            'sharding.compute_kernel="dense"',
            "sharding.compute_kernel = 'dense' is not one of fused",
        ),
    ],
)
def test_bad_settings_name_key_and_value(override: str, message: str) -> None:
    with pytest.raises(ValueError, match="^.*" + message.replace("(", r"\(").replace("[", r"\[")):
        load_job_config(None, [override])


def test_good_settings_still_load() -> None:
    job = load_job_config(
        None, ['model.arch="dcnv2"', "model.dims={C1=8}", "eval.batch_size=0", "train.seed=0"]
    )
    assert job.model.dims == {"C1": 8} and job.train.log_interval == 20


def _preflight(data: Path, *overrides: str, world_size: int = 2, plan: Path | None = None):
    job = job_from_flags(
        None, data, plan, None, ["train.global_batch_size=64", 'train.device="cpu"', *overrides]
    )
    preflight(job, world_size)
    return job


def test_preflight_refuses_what_the_ranks_cannot_run(tiny_dataset: Path) -> None:
    assert _preflight(tiny_dataset).train.global_batch_size == 64
    with pytest.raises(ValueError, match="--nproc-per-node must be at least 1, got 0"):
        _preflight(tiny_dataset, world_size=0)
    with pytest.raises(ValueError, match="optim.sparse = 'adam' runs on CUDA only"):
        _preflight(tiny_dataset, 'optim.sparse="adam"')
    with pytest.raises(
        ValueError, match="^eval.batch_size = 33 does not divide by --nproc-per-node 2$"
    ):
        _preflight(tiny_dataset, "eval.batch_size=33")
    with pytest.raises(ValueError, match="data.eval_splits names 'valid', which .* does not have"):
        _preflight(tiny_dataset, 'data.eval_splits=["valid"]')
    # 1,000 train rows: one global batch of 1,024 is too many with data.tail = drop, fine padded.
    with pytest.raises(
        ValueError, match="split 'train' has 1,000 rows, fewer than one global batch .*1024"
    ):
        _preflight(tiny_dataset, "train.global_batch_size=1024")
    assert (
        _preflight(tiny_dataset, "train.global_batch_size=1024", 'data.tail="pad"').data.tail
        == "pad"
    )
    # model.dims is checked once (shardrec.embeddings), before any rank starts, naming the dataset.
    with pytest.raises(
        ValueError,
        match=f"^{tiny_dataset}: model.dims names features the dataset does not have: C1$",
    ):
        _preflight(tiny_dataset, 'model.arch="dcnv2"', "model.dims={C1=8, f0=4}")
    assert _preflight(tiny_dataset, 'model.arch="dcnv2"', "model.dims={f0=4}").model.dims == {
        "f0": 4
    }


def test_train_refuses_a_missing_eval_part_before_any_rank_starts(tiny_dataset: Path) -> None:
    """A val part gone before the run: named at the start in one line (exit 1), not after the
    first training steps as "the dataset changed under the training"."""
    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.tools.cli.app import app

    part = tiny_dataset / "val" / Manifest.load(tiny_dataset).splits["val"].parts[0].name
    part.unlink()
    with pytest.raises(ValueError, match=rf"^{part}: missing \(named by {tiny_dataset}/manifest"):
        _preflight(tiny_dataset)
    result = CliRunner().invoke(app, ["train", "--data", str(tiny_dataset), "--steps", "1"])
    assert result.exit_code == 1
    assert (
        result.stderr.strip() == f"error: {part}: missing (named by {tiny_dataset}/manifest.json)"
    )


def test_a_split_evaluated_during_training_that_no_evaluation_takes_is_refused(
    tiny_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """eval.during_training = ["vla"] (val misspelt) trained with no evaluation before the end,
    eval.interval_steps or not, and said nothing: refused in one line before any rank starts."""
    from helpers import jobs_handed_to_ranks, settings

    from shardrec.tools.cli.app import app

    handed = jobs_handed_to_ranks(monkeypatch)
    during = 'eval.during_training=["vla"]'
    job = settings("train.global_batch_size=64", 'train.device="cpu"', "eval.interval_steps=1")
    args = ["train", "--data", str(tiny_dataset), "--steps", "2", *job, "--set", during]
    result = CliRunner().invoke(app, args)
    assert (result.exit_code, handed) == (1, [])
    assert result.stderr.strip() == (
        f"error: --set '{during}': eval.during_training names 'vla', which data.eval_splits = "
        "['val', 'test'] does not: it would never be evaluated; name splits of data.eval_splits"
    )
    assert _preflight(tiny_dataset, 'eval.during_training=["val"]').eval.during_training == ["val"]


def test_preflight_refuses_a_dlrm_without_a_bottom_mlp_whose_widths_differ(
    tiny_dataset: Path,
) -> None:
    """The ranks would fail at build ("DLRM needs every embedding width equal to the dense
    output"): refused before any starts, naming the key."""
    with pytest.raises(ValueError, match=r"^model.dense_arch = \[\]: DLRM's dot interaction needs"):
        _preflight(tiny_dataset, "model.dense_arch=[]")


def test_device_auto_is_resolved_by_one_function_for_preflight_and_ranks() -> None:
    import torch

    from shardrec.trainer.distributed.devices import resolve_device_kind

    assert resolve_device_kind("cpu") == "cpu" and resolve_device_kind("cuda") == "cuda"
    assert resolve_device_kind("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="^device kind 'tpu' is not one of auto, cpu, cuda$"):
        resolve_device_kind("tpu")


def test_two_d_plans_are_refused() -> None:
    from shardrec.sharding.plan.plan_file import plan_fingerprint
    from shardrec.sharding.plan.plan_types import PLAN_SCHEMA_VERSION, PlanFile

    fingerprint = plan_fingerprint([], 4, 64, "cpu")
    check_trainable(PlanFile(PLAN_SCHEMA_VERSION, fingerprint, []))
    with pytest.raises(ValueError, match="2D plan .*sharding_group_size = 2.*DMPCollection"):
        check_trainable(PlanFile(PLAN_SCHEMA_VERSION, fingerprint, [], sharding_group_size=2))


def test_resume_with_other_optimizers_is_refused() -> None:
    from shardrec.trainer.rundir.checkpoint.signature import describe_mismatch

    tables = [{"name": "t_C1", "rows": 10, "dim": 8}]
    saved = {
        "model": {"arch": "dlrm"},
        "optim": {"sparse": "rowwise_adagrad", "dense": "adagrad"},
        "tables": tables,
    }
    same = {
        "model": {"arch": "dlrm"},
        "optim": {"sparse": "rowwise_adagrad", "dense": "adagrad"},
        "tables": tables,
    }
    assert describe_mismatch(saved, same) == ""
    other = {**same, "optim": {"sparse": "sgd", "dense": "adagrad"}}
    assert (
        describe_mismatch(saved, other) == "optim.sparse: checkpoint 'rowwise_adagrad', job 'sgd'"
    )
    # Checkpoints written before the optimizers were recorded still load.
    assert describe_mismatch({k: v for k, v in saved.items() if k != "optim"}, other) == ""


def test_samples_per_s_leaves_out_time_between_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardrec.trainer.loop import progress
    from shardrec.trainer.loop.steps import StepStats

    clock = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: clock[0])
    records = []
    writer = type(
        "W", (), {"write": lambda self, r: records.append(r), "close": lambda self: None}
    )()
    reporter = progress.TrainReporter(
        writer, total_steps=20, first_step=0, log_interval=10, lr=lambda: 0.1
    )
    reporter.start_segment()
    clock[0] = 1.0
    reporter.on_report(
        StepStats(step=5, steps=5, loss=0.5, samples=500), 0
    )  # a segment ends at step 5
    clock[0] = 31.0  # 30 s of evaluation and checkpointing
    reporter.start_segment()
    clock[0] = 32.0
    reporter.on_report(StepStats(step=10, steps=5, loss=0.5, samples=500), 0)
    assert records[-1]["samples_per_s"] == pytest.approx(500.0)  # 1,000 samples in 2 s of training


def test_train_cli_refuses_zero_ranks_and_mentions_resume_only_with_a_checkpoint(
    tmp_path: Path,
) -> None:
    from shardrec.tools.cli.app import app
    from shardrec.tools.cli.train import _failure_message
    from shardrec.trainer.distributed.failures import LaunchResult

    result = CliRunner().invoke(app, ["train", "--nproc-per-node", "0"])
    # A usage error: typer's convention, exit 2 and its own message naming the flag.
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--nproc-per-node'" in " ".join(
        result.stderr.replace("│", " ").split()
    )
    failed = LaunchResult(1, failed_first={"rank": 1, "exitcode": -9, "signal": "SIGKILL"})
    assert _failure_message(failed, tmp_path, "") == (
        "training failed: rank 1 was killed by SIGKILL (signal 9); the kernel's OOM killer does "
        "this when memory runs out"
    )
    ckpt = tmp_path / "checkpoints" / "step-00000004"
    ckpt.mkdir(parents=True)
    (ckpt / "train_state.pt").touch()
    (ckpt / ".metadata").touch()
    (ckpt / "digests.json").touch()  # written last: what makes a checkpoint complete
    assert _failure_message(failed, tmp_path, "").endswith(
        "step-00000004 (step 4), is kept and a re-run resumes from it"
    )
    # A shard that fails its digest (the ranks check the .distcp files): a rerun would resume
    # from that checkpoint again, so the line names the one before it, or --restart.
    shard = ckpt / "__1_0.distcp"
    refused = LaunchResult(
        1, reasons={1: f"{shard}: contents differ from the digest written at save time (changed "
        "since); refusing the checkpoint"}
    )  # fmt: skip
    assert _failure_message(refused, tmp_path, "").endswith(
        "refusing the checkpoint; no earlier checkpoint: start over with --restart"
    )
    before = tmp_path / "checkpoints" / "step-00000002"
    before.mkdir()
    (before / "digests.json").touch()
    assert _failure_message(refused, tmp_path, "").endswith(
        f"; to resume from the one before it, {before} (step 2), move {ckpt} out of "
        f"{ckpt.parent}, or start over with --restart"
    )


def test_a_newest_checkpoint_of_another_job_is_said_refused_not_kept_for_a_rerun(
    tmp_path: Path,
) -> None:
    """A rank refuses the newest checkpoint as another dataset's (or model's): a rerun would meet
    it again, so the last line says how to get past it, not that a rerun resumes from it."""
    from shardrec.tools.cli.train import _failure_message
    from shardrec.trainer.distributed.failures import LaunchResult
    from shardrec.trainer.rundir.checkpoint.signature import check_signature

    ckpt = tmp_path / "checkpoints" / "step-00000062"
    ckpt.mkdir(parents=True)
    (ckpt / "digests.json").touch()
    signature = {"model": {}, "optim": {}, "tables": [], "dataset": "bedce440f26b" * 2}
    with pytest.raises(ValueError) as refusal:
        check_signature(ckpt, signature, {**signature, "dataset": "092a451420ff" * 2})
    refused = LaunchResult(1, reasons={0: str(refusal.value)})
    assert _failure_message(refused, tmp_path, "") == (
        f"training failed: rank 0: {ckpt}: checkpoint of another model, optimizer or dataset: dataset: "
        "checkpoint trained on fingerprint bedce440f26b, job's data is 092a451420ff; no earlier "
        "checkpoint: start over with --restart"
    )
    before = tmp_path / "checkpoints" / "step-00000050"
    before.mkdir()
    (before / "digests.json").touch()
    assert _failure_message(refused, tmp_path, "").endswith(
        f"; a re-run resumes from that checkpoint again; to resume from the one before it, "
        f"{before} (step 50), move {ckpt} out of {ckpt.parent}, or start over with --restart"
    )


def test_a_dataset_changed_before_the_launch_is_not_said_to_have_changed_under_the_training(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    from shardrec.dataloader.format.integrity import changed_since_written
    from shardrec.tools.cli.train import _failure_message
    from shardrec.trainer.distributed.failures import LaunchResult

    parts = sorted((tiny_dataset / "train").glob("*.arrow"))
    written = (tiny_dataset / "manifest.json").stat().st_mtime
    os.utime(parts[0], (written + 5, written + 5))
    before = changed_since_written(tiny_dataset)  # as the launcher finds it before the ranks
    os.utime(parts[1], (written + 9, written + 9))  # and a part rewritten while they train
    failed = LaunchResult(1, reasons={0: f"{parts[0]}: column label, row 5 has label 7"})
    assert _failure_message(failed, tmp_path, str(tiny_dataset), before) == (
        f"training failed: rank 0: {parts[0]}: column label, row 5 has label 7; the dataset had "
        f"changed before the run started: {parts[0]}: modified after the manifest was written; "
        f"the dataset changed under the training: {parts[1]}: modified after the manifest was "
        "written"
    )


GLOO_RESET = (
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
    "[127.0.0.1]:1413: Connection reset by peer"
)


def test_the_rank_killed_first_is_blamed_not_the_survivor_whose_collective_failed() -> None:
    from shardrec.trainer.distributed.failures import LaunchResult

    killed = {"rank": 1, "exitcode": -9, "signal": "SIGKILL"}
    oom = "rank 1 was killed by SIGKILL (signal 9); the kernel's OOM killer does this when memory runs out"
    # Rank 0's collective failed when rank 1 died: a consequence, not the cause.
    assert LaunchResult(1, failed_first=killed, peers_gone={0: GLOO_RESET}).cause == oom
    # The agent saw both within its clock's second and took rank 0 as first: still rank 1.
    tie = {
        "rank": 0,
        "exitcode": 1,
        "signal": "",
        "failures": {
            "0": {"exitcode": 1, "signal": ""},
            "1": {"exitcode": -9, "signal": "SIGKILL"},
        },
    }
    assert LaunchResult(1, failed_first=tie, peers_gone={0: GLOO_RESET}).cause == oom
    # A rank's own reason is the cause; a lost peer alone is named when nothing else is known.
    own = LaunchResult(1, failed_first=tie, reasons={1: "data/x.npy: 12 bytes"})
    assert own.cause == "rank 1: data/x.npy: 12 bytes"
    assert LaunchResult(1, peers_gone={1: GLOO_RESET}).cause == f"rank 1: {GLOO_RESET}"
    segv = LaunchResult(1, failed_first={"rank": 0, "exitcode": -11, "signal": "SIGSEGV"})
    assert segv.cause == "rank 0 was killed by SIGSEGV (signal 11); a crash in native code"


class _Failure:
    """torchrun's ProcessFailure, as far as its line reads it."""

    def __init__(self, exitcode: int, timestamp: int) -> None:
        self.exitcode, self.timestamp = exitcode, timestamp

    def signal_name(self) -> str:
        return "SIGKILL"


def test_torchruns_own_line_names_a_killed_rank_before_one_that_exited() -> None:
    from shardrec.trainer.distributed.failures import failures_line

    survivor, killed = _Failure(1, 100), _Failure(-9, 100)  # the same second: a tie
    assert failures_line(0, survivor, {0: survivor, 1: killed}) == (
        "ranks failed: rank 1 was killed by SIGKILL (signal 9), rank 0 exited with code 1"
    )
    assert failures_line(0, _Failure(2, 5), {0: _Failure(2, 5)}) == (
        "rank 0 failed first (exit code 2)"
    )


def test_a_collective_that_lost_its_peer_is_told_from_a_bug() -> None:
    import torch.distributed as dist

    from shardrec.trainer.distributed.rank_process import peer_gone

    assert peer_gone(RuntimeError(GLOO_RESET))
    assert peer_gone(RuntimeError("[pair.cc:598] Connection closed by peer [127.0.0.1]:4026"))
    assert peer_gone(dist.DistNetworkError("failed to recv, got 0 bytes"))
    assert not peer_gone(RuntimeError("mat1 and mat2 shapes cannot be multiplied (64x8 and 16x8)"))
    assert not peer_gone(ValueError("bad id"))
