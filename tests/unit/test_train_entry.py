"""The rank entry's warning filter and the train flags that `shardrec train` and the ranks share."""

from __future__ import annotations

import ast
import typing
import warnings
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

# At module level: typer resolves the annotations of `rank` below in this module's namespace.
from shardrec.trainer.job import flags
from shardrec.trainer.job.config import JobConfig, load_job_config


def test_only_the_known_harmless_warnings_are_hidden() -> None:
    from shardrec.trainer.distributed.rank_process import ignore_known_warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ignore_known_warnings()
        warnings.warn(
            "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead.",
            FutureWarning,
            stacklevel=2,
        )
        warnings.warn(
            "Please use DTensor instead and we are deprecating ShardedTensor.",
            FutureWarning,
            stacklevel=2,
        )
        warnings.warn(
            "some indices are out of range [0, 50)", UserWarning, stacklevel=2
        )  # shaped like fbgemm's
        warnings.warn("a change of behaviour in the next release", FutureWarning, stacklevel=2)
    assert [str(w.message) for w in seen] == [
        "some indices are out of range [0, 50)",
        "a change of behaviour in the next release",
    ]


def test_torchs_own_warnings_stay_hidden_in_a_rank() -> None:
    # A rank that imported torch only after configure_rank_logging printed torch.fx's "[rank0]:W...
    # is_fx_tracing will return true for both fx.symbolic_trace and torch.export. ..." at its
    # first checkpoint: torch's import had set the "torch" logger back to WARNING.
    import subprocess
    import sys

    script = (
        "from shardrec.trainer.distributed.rank_process import configure_rank_logging\n"
        "configure_rank_logging()\n"
        "from torch.fx._symbolic_trace import is_fx_tracing\n"
        "is_fx_tracing()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr


def test_flags_that_set_a_job_setting_show_its_docstring() -> None:
    from shardrec.trainer.job import flags
    from shardrec.trainer.job.sections import TrainConfig
    from shardrec.trainer.job.toml_values import field_help

    option = typing.get_args(flags.StepsFlag)[1]
    assert option.help == f"{field_help(TrainConfig)['steps'].rstrip('.')}; sets train.steps."
    assert " ".join(field_help(TrainConfig)["steps"].split()) == (
        "Steps to train, past an epoch's end into the next epoch (0: train.epochs epochs); with "
        "--continue-on, the steps of the new stretch, counted from its first (a run at step 2 "
        "that goes on for 5 steps ends at step 7)."
    )


def test_the_ranks_parse_what_shardrec_train_passes_them(tmp_path: Path) -> None:
    parsed = {}

    def rank(
        config: flags.ConfigFlag = None,
        out_dir: flags.OutDirFlag = Path("x"),
        set_: flags.SetFlag = None,
        allow_change: flags.AllowChangeFlag = None,
        job: flags.JobFlag = None,
    ) -> None:
        parsed.update(config=config, out_dir=out_dir, overrides=set_, allow=allow_change, job=job)

    args = flags.rank_args(tmp_path / "job.toml", tmp_path / "run", ["optim.dense_lr", "train"])
    app = typer.Typer()
    app.command()(rank)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert parsed == {
        "config": None,
        "out_dir": tmp_path / "run",
        "overrides": None,
        "allow": ["optim.dense_lr", "train"],
        "job": tmp_path / "job.toml",
    }


def test_the_ranks_read_back_the_job_the_launcher_resolved(tmp_path: Path) -> None:
    """`shardrec train` resolves the flags once and writes the job; each rank reads that file and
    gets an equal JobConfig, even for values a TOML writer gets wrong (non-ASCII, control
    characters, the largest and smallest floats, nested tables; an infinity is refused)."""
    (tmp_path / "job.toml").write_text("[train]\nseed = 3\n[optim]\ndense_lr = 0.1\n")
    resolved = flags.job_from_flags(
        tmp_path / "job.toml",
        Path("data dir/ü 😀"),
        None,
        7,
        [
            'data.multihot_cache="tab\\t \\u007f quote\\" back\\\\"',
            "optim.eps=1e-300",
            "optim.sparse_lr=1e308",
            'sharding.constraints={t_C1={sharding_types=["row_wise"], min_partition=4}}',
        ],
    )
    assert resolved.train.seed == 3 and resolved.train.steps == 7 and resolved.optim.dense_lr == 0.1
    assert resolved.data.path == "data dir/ü 😀" and resolved.optim.sparse_lr == 1e308
    (tmp_path / "resolved.toml").write_text(resolved.to_toml())
    assert flags.rank_job(tmp_path / "resolved.toml", None, None, None, None, []) == resolved
    assert load_job_config(tmp_path / "resolved.toml") == resolved
    assert flags.rank_job(None, tmp_path / "job.toml", None, None, None, []) == load_job_config(
        tmp_path / "job.toml"
    )
    with pytest.raises(ValueError, match=r"give it without --data, --steps, --set$"):
        flags.rank_job(tmp_path / "resolved.toml", None, Path("d"), None, 7, ["train.seed=1"])
    assert JobConfig().to_toml() == load_job_config(None).to_toml()


def test_the_rank_entry_takes_every_train_flag_and_eval_ranks_use_its_public_helpers() -> None:
    """The rank program parses --allow-change (it checks the run directory itself), and both rank
    programs (training's and eval's) share one logging set-up and exit
    (trainer.distributed.rank_process) through public names, not private ones."""
    import inspect

    from shardrec.trainer.inference import eval_entry
    from shardrec.trainer.loop import train_entry as entry

    assert "allow_change" in inspect.signature(entry.rank_main).parameters
    for module in (entry, eval_entry):
        tree = ast.parse(Path(module.__file__).read_text())
        imported = [
            (n.module, a.name)
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom)
            for a in n.names
        ]
        assert (
            "shardrec.trainer.distributed.rank_process",
            "configure_rank_logging",
        ) in imported, module
        assert ("shardrec.trainer.distributed.rank_process", "exit_cleanly") in imported, module
        assert [name for _, name in imported if name.startswith("_")] == [], module


def test_the_eval_ranks_read_back_the_request_shardrec_eval_wrote() -> None:
    from shardrec.trainer.inference.eval_request import EvalRequest

    for request in (
        EvalRequest(Path("runs/a")),
        EvalRequest(
            Path("/abs/run ü"), step=12, split="val", data=Path("other data"), device="cpu"
        ),
    ):
        assert EvalRequest.from_json(request.to_json()) == request


def test_shardrec_eval_starts_its_ranks_through_launch_with_one_request_file(
    tmp_path: Path, monkeypatch
) -> None:
    """`shardrec eval` checks the request, then starts its rank program through
    trainer.distributed.launch (as `shardrec train` does), handing the ranks the request as JSON."""
    import json
    import shutil

    from conftest import write_tiny_dataset

    from shardrec.tools.cli.app import app
    from shardrec.trainer.distributed import launch
    from shardrec.trainer.inference import eval_entry
    from shardrec.trainer.inference.eval_request import EvalRequest

    run, data = tmp_path / "run", tmp_path / "data"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "run-killed-at-step-6", run)
    write_tiny_dataset(data)
    calls = []

    def fake_launch(
        args: list[str], nproc_per_node: int, *, module: str, stop_grace_s: float
    ) -> launch.LaunchResult:
        parsed = dict(zip(args[::2], args[1::2]))
        request = EvalRequest.from_json(Path(parsed["--request"]).read_text())
        calls.append((request, nproc_per_node, module, stop_grace_s))
        metrics = {
            "step": 4,
            "split": "val",
            "world_size": 3,
            "trained_world_size": 2,
            "samples": 256,
        }
        Path(parsed["--result"]).write_text(
            json.dumps({**metrics, "auc": 0.5, "logloss": 0.7, "ne": 1.0})
        )
        return launch.LaunchResult(0)

    monkeypatch.setattr(launch, "launch", fake_launch)
    args = [
        "eval",
        str(run),
        "--split",
        "val",
        "--nproc-per-node",
        "2",
        "--data",
        str(data),
        "--json",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    # No grace after a signal: an evaluation has no checkpoint to write.
    assert calls == [
        (EvalRequest(run, None, "val", data, device="auto"), 2, eval_entry.__name__, 0)
    ]
    assert json.loads(result.stdout)["auc"] == 0.5


_FAILING_CUDA_RANK = """
import atexit, sys
from shardrec.trainer.distributed.rank_process import exit_after_cuda_failure
atexit.register(lambda: print("teardown ran", flush=True))  # stands for NCCL's blocking teardown
try:
    raise RuntimeError("CUDA error: device-side assert triggered")
except Exception:
    exit_after_cuda_failure()
"""


def test_a_failed_cuda_rank_ends_at_once_with_its_traceback_and_no_teardown() -> None:
    """What a rank does after a device-side assert (fbgemm's FATAL bounds check): exit 1 now, so
    torchrun stops its peers, instead of a teardown that may wait on NCCL work forever."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _FAILING_CUDA_RANK], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "RuntimeError: CUDA error: device-side assert triggered" in done.stderr
    assert "teardown ran" not in done.stdout


_RANK_THAT_LOST_A_PEER = """
from shardrec.trainer.distributed.rank_process import exit_after_peer_loss
exit_after_peer_loss(RuntimeError("[pair.cc:537] Read error: Connection reset by peer"))
"""


def _rank_that_lost_a_peer(env: dict[str, str]):
    """A rank process that lost a peer, under `env`: its completed process."""
    import subprocess
    import sys

    return subprocess.run(
        [sys.executable, "-c", _RANK_THAT_LOST_A_PEER],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.parametrize("restart", [0, 1])
def test_a_rank_that_lost_a_peer_says_whether_torchrun_restarts_the_ranks(
    restart: int, tmp_path: Path
) -> None:
    """With --max-restarts 1, the first attempt's surviving rank said the failed rank "is named
    last", and then the restarted run finished: no line named it, nothing said it was restarted."""
    import os

    from shardrec.trainer.distributed.launch import LAUNCHER_DIR_ENV

    env = {
        **os.environ,
        "RANK": "0",
        "TORCHELASTIC_MAX_RESTARTS": "1",
        "TORCHELASTIC_RESTART_COUNT": str(restart),
        LAUNCHER_DIR_ENV: str(tmp_path),  # a rank of `shardrec train`, whose launcher names it
    }
    done = _rank_that_lost_a_peer(env)
    lost = "error: rank 0 lost another rank (RuntimeError: [pair.cc:537] Read error: Connection "
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        lost
        + (
            "reset by peer); torchrun restarts the ranks (restart 1 of --max-restarts 1), which "
            "resume from the newest checkpoint"
            if restart == 0
            else "reset by peer); the rank that failed first is named last"
        )
    ]


def test_a_rank_of_a_plain_torchrun_that_lost_a_peer_does_not_promise_a_line_naming_it() -> None:
    """Node 1 of a two-node `torchrun ... -m shardrec.trainer` whose node 0 was killed said "the
    rank that failed first is named last"; then its torchrun's summary named only rank 1 itself
    (exitcode 1): no launcher names the other node's rank."""
    import os

    from shardrec.trainer.distributed.launch import LAUNCHER_DIR_ENV

    env = {k: v for k, v in os.environ.items() if k != LAUNCHER_DIR_ENV} | {"RANK": "1"}
    done = _rank_that_lost_a_peer(env)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: rank 1 lost another rank (RuntimeError: [pair.cc:537] Read error: Connection "
        "reset by peer); the rank that failed first may be another node's: its node's output "
        "names it"
    ]


@pytest.mark.parametrize("given", [["--plan", ""], ["--plan="]])
def test_an_empty_plan_flag_plans_at_start_up(
    given: list[str], tiny_dataset: Path, tmp_path: Path, monkeypatch
) -> None:
    """`--plan ''` is what its help says (plan at start-up), as `--set 'sharding.plan=""'` is:
    not the current directory read as a plan file."""
    from helpers import jobs_handed_to_ranks

    from shardrec.tools.cli.app import app

    handed = jobs_handed_to_ranks(monkeypatch)
    args = ["train", "--data", str(tiny_dataset), "--out-dir", str(tmp_path / "run"), *given]
    job = ["--set", 'train.device="cpu"', "--set", "train.global_batch_size=64"]
    result = CliRunner().invoke(app, [*args, *job])
    assert [j.sharding.plan for j in handed] == [""], result.output
    assert result.exit_code == 1
