"""Start-up: the commands that need no torch do not import it (`plan show`, `runs`, `config`,
`data stats / head / verify`), and a bad flag value is one line before any heavy import (`train`,
`plan`, `eval`, `export`, `predict`), as are a path that holds no dataset (`data digest`), a stale
plan and constraints that cannot hold (on a host without GPUs: `train.device = "auto"` asks torch
where one is); `-v` works after the command too; `--help` shows no type beside a flag; `--help`
and `data --help` import no command module, and `data stats` neither numba nor pandas.

One fresh interpreter runs every command in turn (lightest first: a module once imported stays)
and reports, after each, its exit code, last stderr line and whether torch or torchrec are loaded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import TINY_MODEL, assert_one_line_error
from typer.testing import CliRunner

from shardrec.tools.cli.app import app

SCRIPT = """
import json, sys
from typer.testing import CliRunner
from shardrec.tools.cli.app import app
for args in json.loads(sys.argv[1]):
    result = CliRunner().invoke(app, args)
    heavy = sorted(m for m in ("torch", "torchrec") if m in sys.modules)
    print(json.dumps([args[:2], result.exit_code, (result.stderr.strip().splitlines() or [""])[-1], heavy]))
"""


PINNED = 'sharding.constraints={t_f3={sharding_types=["column_wise"], min_partition=8}}'
"""Two 8-wide column shards of the 16-wide t_f3: a constraint that cannot hold on 1 rank."""


BATCH = ["--set", "train.global_batch_size=64"]


def _fake_run(run: Path, data: Path | None = None, plan: Path | None = None) -> None:
    """A run directory as `runs` and `eval` read it: config, plan, one complete checkpoint, its
    unheld lock, metrics (stopped at step 4)."""
    from shardrec.trainer.job.config import load_job_config

    (run / "checkpoints" / "step-00000004").mkdir(parents=True)
    (run / "checkpoints" / "step-00000004" / "digests.json").write_text('{"files": {}}')
    (run / "config.toml").write_text(load_job_config(None, [f'data.path="{data or ""}"']).to_toml())
    (run / ".lock").write_text("")
    if plan is not None:
        (run / "plan.json").write_bytes(plan.read_bytes())
    records = [
        {"kind": "eval", "split": "val", "step": 4, "auc": 0.75, "final": False},
        {"kind": "stop", "step": 4, "reason": "SIGTERM"},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_light_commands_never_import_torch_and_bad_flags_are_caught_first(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    plan = tmp_path / "plan.json"
    planned = CliRunner().invoke(
        app, ["plan", "--data", str(tiny_dataset), "--world-size", "2", "--out", str(plan), *BATCH]
    )
    assert planned.exit_code == 0, planned.output
    run = tmp_path / "runs" / "a"
    _fake_run(run, tiny_dataset, plan)
    data = str(tiny_dataset)
    commands = [
        ["plan", "show", str(plan)],
        ["runs", str(tmp_path / "runs"), "--json"],
        ["runs", str(tmp_path / "runs"), "-v"],
        ["config", "defaults"],
        ["config", "show", "--set", "train.seed=3"],
        ["data", "stats", data],
        ["data", "head", data, "--rows", "2"],
        ["data", "verify", data],
        ["data", "digest", str(tmp_path / "missing")],
        ["data", "digest", str(tmp_path / "runs")],
        ["train", "--data", data, "--steps", "-5"],
        ["train", "--data", str(tmp_path / "missing")],
        ["plan", "--data", data, "--topology", "nope"],
        ["eval", str(run), "--split", "nope"],
        ["export", str(run), "--out", str(tmp_path)],
        ["predict", str(run), data],
        ["train", "--data", data, "--plan", str(plan), "--nproc-per-node", "4", *BATCH],
        ["train", "--data", data, "--nproc-per-node", "1", "--set", PINNED, *BATCH],
    ]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(commands)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("[[")]
    assert len(results) == len(commands), done.stdout
    for (command, code, last, heavy), expected in zip(
        results,
        [0] * 8 + [1] * 10,
    ):
        assert (code, heavy) == (expected, []), f"{command}: exit {code}, imported {heavy}: {last}"
    lines = [last for _, _, last, _ in results[8:]]
    assert lines == [
        # Before, torchrec was imported (seconds) before the path was looked at.
        f"error: {tmp_path / 'missing'}: does not exist",
        f"error: {tmp_path / 'runs'}: not a shardrec dataset (no manifest.json); create one with "
        "`shardrec preprocess`",
        "error: --steps -5: train.steps = -5 must be >= 0",
        f"error: --data {tmp_path / 'missing'}: does not exist",
        "error: --topology nope: not one of auto, cpu-gloo, a100, h100, h200",
        f"error: {tiny_dataset.resolve()}: no rows in split 'nope' to evaluate (has train, val, test)",
        f"error: --out {tmp_path}: is a directory; give a file name such as {tmp_path / 'model.safetensors'}",
        f"error: {run}: a run directory, not a model file; export it first: "
        f"`shardrec export {run} --out model.safetensors`",
        f"error: {plan}: the plan was made for another job: world size: plan 2, job 4 (train with "
        "--nproc-per-node 2, or --plan '' to plan at start-up, or re-run "
        "`shardrec plan --world-size 4`)",
        f"error: --set {PINNED!r}: sharding.constraints.t_f3: no sharding type satisfies the "
        "constraint (sharding_types "
        "['column_wise'], ranks all, min_partition 8, embedding_dim 16, world size 1); change or "
        "drop it for this world size (--set 'sharding.constraints={}' drops them all; a run "
        "resumes under any constraints)",
    ]


def test_train_or_eval_started_as_one_of_torchruns_ranks_is_one_line_before_anything(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    # Before, each process `torchrun -m shardrec.tools.cli train` started trained a job of its own
    # on the run directory: one trained, the other was refused its lock ("runs/a is in use by job
    # ..."), and torchrun stopped the one training.
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "shardrec.tools.cli", "train", "--data", str(tiny_dataset)]
        + ["--out-dir", str(run), "--nproc-per-node", "2", "--steps", "1", *BATCH],
        env={**os.environ, "RANK": "1", "WORLD_SIZE": "2"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert_one_line_error(
        done,
        "^"
        + re.escape(
            "error: shardrec train starts its own ranks (--nproc-per-node 2), but this process is "
            "already rank 1 of 2 (RANK=1, WORLD_SIZE=2 in its environment, as torchrun sets "
            "them): run shardrec train once, outside torchrun; on several machines, run "
            "`torchrun ... -m shardrec.trainer ...` on each instead"
        )
        + "$",
    )
    assert not run.exists()
    # Before, each process evaluated the run with ranks of its own, and each printed its results.
    evaluated = CliRunner().invoke(app, ["eval", str(run)], env={"RANK": "1", "WORLD_SIZE": "2"})
    assert_one_line_error(
        evaluated,
        "^"
        + re.escape(
            "error: shardrec eval starts its own ranks, but this process is already rank 1 of 2 "
            "(RANK=1, WORLD_SIZE=2 in its environment, as torchrun sets them): run shardrec eval "
            "once, outside torchrun"
        )
        + "$",
    )


def test_runs_lists_a_stopped_run_and_help_shows_no_flag_types(tmp_path: Path) -> None:
    _fake_run(tmp_path / "a")
    listed = CliRunner().invoke(app, ["runs", str(tmp_path), "--json", "-v"])
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout) == [
        {
            "run": str(tmp_path / "a"),
            "step": 4,
            "status": "stopped",
            "best_val_auc": 0.75,
            "misnamed_checkpoints": [],
            "copied_checkpoints": [],
        }
    ]
    # A rerun resumed it and died before its next checkpoint: failed, no longer stopped.
    with (tmp_path / "a" / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"kind": "resume", "step": 4, "epoch": 0}) + "\n")
    listed = CliRunner().invoke(app, ["runs", str(tmp_path), "--json"])
    assert [r["status"] for r in json.loads(listed.stdout)] == ["failed"]
    # Printed as named: rich took "[old]" for a style tag and showed the run as ".../exp".
    _fake_run(tmp_path / "exp[old]")
    table = CliRunner().invoke(app, ["runs", str(tmp_path)])
    assert f"{tmp_path / 'exp[old]'} " in table.stdout, table.stdout
    # The ranks to start are --nproc-per-node in every command (bench train's --nproc still works).
    ranks = CliRunner().invoke(app, ["bench", "train", "--nproc-per-node", "0"])
    assert ranks.exit_code == 1 and "--nproc-per-node" in ranks.stderr, ranks.output
    for args in (["--help"], ["runs", "--help"], ["train", "--help"], ["data", "verify", "--help"]):
        shown = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
        assert shown.exit_code == 0 and "--help" in shown.stdout
        assert "<bool>" not in shown.stdout, f"{args}:\n{shown.stdout}"


def test_runs_names_a_checkpoint_folder_renamed_by_hand(tmp_path: Path) -> None:
    # Before: the run's only checkpoint, renamed step-4, was not a word: step -, failed, and no
    # command read it (a rerun started over beside it).
    _fake_run(tmp_path / "a")
    checkpoints = tmp_path / "a" / "checkpoints"
    (checkpoints / "step-00000004").rename(checkpoints / "step-4")
    (checkpoints / ".step-00000008.tmp").mkdir()  # a save under way: not a checkpoint yet
    (checkpoints / ".step-00000008.tmp" / "train_state.pt").write_bytes(b"")
    listed = CliRunner().invoke(app, ["runs", str(tmp_path), "--json"])
    assert json.loads(listed.stdout)[0]["misnamed_checkpoints"] == [str(checkpoints / "step-4")]
    shown = CliRunner().invoke(app, ["runs", str(tmp_path)])
    assert shown.stdout.splitlines()[-1] == (
        f"misnamed: {checkpoints / 'step-4'}: a checkpoint's files in a folder not named "
        "step-NNNNNNNN, which no command reads (renamed or copied by hand?); rename it "
        f"step-00000004 if it holds step 4, or move it out of {checkpoints}"
    )


def test_continue_on_names_a_renamed_checkpoint_folder_first(tiny_dataset: Path, tmp_path: Path):
    # Before: "error: RUN: no checkpoint to continue from; train it first (without
    # --continue-on)", though the run's checkpoint was there, renamed step-4 by hand.
    run = tmp_path / "runs" / "a"
    _fake_run(run, data=tiny_dataset)
    checkpoints = run / "checkpoints"
    (checkpoints / "step-00000004").rename(checkpoints / "step-4")
    refused = CliRunner().invoke(
        app, ["train", "--out-dir", str(run), "--continue-on", str(tiny_dataset)]
    )
    assert_one_line_error(
        refused,
        "^"
        + re.escape(
            f"error: {checkpoints / 'step-4'}: a checkpoint's files in a folder not named "
            "step-NNNNNNNN, which no command reads (renamed or copied by hand?); rename it "
            f"step-00000004 if it holds step 4, or move it out of {checkpoints}; or start over "
            "with --restart"
        )
        + "$",
    )


def test_a_link_to_a_checkpoint_beside_it_is_no_renamed_checkpoint(tmp_path: Path) -> None:
    # Before: a `latest` link to the newest checkpoint was "misnamed" in `shardrec runs`, and
    # `train` refused to resume ("rename it step-NNNNNNNN ..."), though every command reads the
    # checkpoint it links to by its own name. A link elsewhere is still named.
    from shardrec.tools.cli.train_run_dir import check_resume_checkpoint

    _fake_run(tmp_path / "a")
    checkpoints = tmp_path / "a" / "checkpoints"
    (checkpoints / "latest").symlink_to("step-00000004")
    listed = CliRunner().invoke(app, ["runs", str(tmp_path), "--json"])
    assert json.loads(listed.stdout)[0]["misnamed_checkpoints"] == []
    check_resume_checkpoint(tmp_path / "a")  # no refusal: train resumes from step-00000004
    (checkpoints / "loop").symlink_to("loop")  # a link to itself is no checkpoint, not a crash
    listed = CliRunner().invoke(app, ["runs", str(tmp_path), "--json"])
    assert json.loads(listed.stdout)[0]["misnamed_checkpoints"] == []
    (checkpoints / "latest").unlink()
    shutil.copytree(checkpoints / "step-00000004", tmp_path / "kept")
    (checkpoints / "latest").symlink_to(tmp_path / "kept")
    listed = CliRunner().invoke(app, ["runs", str(tmp_path), "--json"])
    assert json.loads(listed.stdout)[0]["misnamed_checkpoints"] == [str(checkpoints / "latest")]


def test_runs_names_a_checkpoint_copied_under_another_step(tmp_path: Path) -> None:
    # Before: step-00000008, a copy of step-00000004, was listed as the run's step 8, and train,
    # eval and export then refused it ("holds the checkpoint of step 4, not of step 8").
    _fake_run(tmp_path / "a")
    checkpoints = tmp_path / "a" / "checkpoints"
    shutil.copytree(checkpoints / "step-00000004", checkpoints / "step-00000008")
    listed = CliRunner().invoke(app, ["runs", str(tmp_path), "--json"])
    assert json.loads(listed.stdout)[0]["copied_checkpoints"] == [
        str(checkpoints / "step-00000008")
    ]
    shown = CliRunner().invoke(app, ["runs", str(tmp_path)])
    assert shown.stdout.splitlines()[-1] == (
        f"copied: {checkpoints / 'step-00000008'}: the same files as step-00000004 (their "
        "digests.json agree: a copy), one step's checkpoint under two names; train, eval and "
        f"export refuse the one not named for its step: move the copy out of {checkpoints}"
    )


def test_runs_names_the_copy_not_the_checkpoint_it_copies_under_an_older_name(
    tmp_path: Path,
) -> None:
    # Before: step-00000008, copied by hand as step-00000006, was the one named a copy ("move the
    # copy out") and listed in --json's copied_checkpoints: the run's newest checkpoint. The step
    # its train_state.pt holds tells which, read without torch.
    import torch

    _fake_run(tmp_path / "a")
    checkpoints = tmp_path / "a" / "checkpoints"
    (checkpoints / "step-00000008").mkdir()
    state = {"format_version": 1, "progress": {"step": 8, "epoch": 0}, "w": torch.ones(2)}
    torch.save(state, checkpoints / "step-00000008" / "train_state.pt")
    (checkpoints / "step-00000008" / "digests.json").write_text('{"files": {"8": ""}}')
    shutil.copytree(checkpoints / "step-00000008", checkpoints / "step-00000006")
    imported, listed = _imported(["runs", str(tmp_path), "--json"], ("torch",))
    assert imported == []
    assert json.loads(listed)[0]["copied_checkpoints"] == [str(checkpoints / "step-00000006")]
    # The copy is said once, as the folder named for another step than it holds.
    shown = CliRunner().invoke(app, ["runs", str(tmp_path)])
    assert shown.stdout.splitlines()[-1] == (
        f"misnamed: {checkpoints / 'step-00000006' / 'train_state.pt'}: holds the checkpoint of "
        "step 8, not of step 6 as its folder's name says (copied by hand? step-00000008 is there "
        f"too); move step-00000006 out of {checkpoints}"
    )


def _imported(args: list[str], modules: tuple[str, ...]) -> tuple[list[str], str]:
    """Which of `modules` `shardrec ARGS` imported, run in a fresh interpreter, and its stdout."""
    script = (
        "import sys, json\n"
        "from shardrec.tools.cli.entry import main\n"
        f"sys.argv = ['shardrec', *{args!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print(json.dumps([m for m in {modules!r} if m in sys.modules]), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    return json.loads(done.stderr.strip().splitlines()[-1]), done.stdout


def test_help_imports_no_command_module_and_data_stats_no_kernels(tiny_dataset) -> None:
    heavy = ("numpy", "numba", "torch", "shardrec.tools.cli.preprocess")
    imported, listed = _imported(["--help"], heavy)
    assert imported == [] and "preprocess" in listed
    imported, listed = _imported(["data", "--help"], heavy)
    assert imported == [] and "reference-npy" in listed
    imported, shown = _imported(["data", "stats", str(tiny_dataset)], ("numba", "pandas", "torch"))
    assert imported == [] and "dense features" in shown


def test_runs_lists_a_job_in_its_first_seconds_by_its_lock(tmp_path: Path) -> None:
    """`shardrec train` takes RUN/.lock before the ranks start; rank 0 writes config.toml seconds
    later: meanwhile the run is listed as running."""
    from shardrec.trainer.rundir.lock import acquire_run_lock

    (tmp_path / "new").mkdir()
    lock = acquire_run_lock(tmp_path / "new", "job1")
    try:
        listed = CliRunner().invoke(app, ["runs", str(tmp_path), "--json"])
    finally:
        lock.release()
    assert json.loads(listed.stdout) == [
        {
            "run": str(tmp_path / "new"),
            "step": None,
            "status": "running",
            "best_val_auc": None,
            "misnamed_checkpoints": [],
            "copied_checkpoints": [],
        }
    ]
    assert json.loads(CliRunner().invoke(app, ["runs", str(tmp_path), "--json"]).stdout) == []


def test_train_and_eval_leave_torch_to_their_ranks(tiny_dataset: Path, tmp_path: Path) -> None:
    """torch takes seconds to import, and only the ranks use it: `shardrec train` and `shardrec
    eval` (its --device auto on a host without GPUs) start them without importing it themselves.
    Before, train imported it to name the agent's rendezvous, eval to learn that auto is the CPU."""
    run = tmp_path / "run"
    job = [*BATCH, "--set", 'train.device="cpu"', *(f for s in TINY_MODEL for f in ("--set", s))]
    imported, shown = _imported(
        ["train", "--data", str(tiny_dataset), "--out-dir", str(run), "--nproc-per-node", "1"]
        + ["--steps", "1", "--json", *job],
        ("torch",),
    )
    assert (imported, json.loads(shown)["steps"]) == ([], 1), shown
    imported, shown = _imported(["eval", str(run)], ("torch",))
    assert imported == [] and re.search(r"run step 1 on test \(1 rank.*AUC", shown), shown
