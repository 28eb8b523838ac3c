"""A run of static tables (hashed ids, `--max-ids`) that goes on day by day (`--continue-on`):
such a run lists its stretches in RUN/stretches.json only from its first continuation on, unlike
one with managed tables. What it must hold all the same: each stretch's last checkpoint, and a
stretch killed before its first checkpoint refused (and listed) as unfinished until it is.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_one_line_error, cli, cli_process

JOB = """
[train]
device = "cpu"
global_batch_size = 64

[data]
eval_splits = ["test"]

[checkpoint]
interval_steps = 5
"""


def train(root: Path, *args: str, env: dict[str, str] | None = None, ok: bool = True):
    """`shardrec train ARGS` on one rank, as the user starts it."""
    return cli_process(["train", "--nproc-per-node", "1", *args], root, env, ok)


def last_steps(run_dir: Path) -> list[int | None]:
    listed = json.loads((run_dir / "stretches.json").read_text())["stretches"]
    return [s["last_step"] for s in listed]


def checkpoint_steps(run_dir: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*"))


@pytest.fixture(scope="module")
def days(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 drifting days of ~13 steps each, static tables; `day0`: a run trained on day 0."""
    root = tmp_path_factory.mktemp("static_days")
    with contextlib.chdir(root):
        cli("synth", "raw", "--like", "drift", "--days", "3", "--rows", "3000")
        for d in range(3):
            cli("preprocess", f"raw/day_{d}", "--out", f"days/{d}", "--max-ids", "1000")
    (root / "job.toml").write_text(JOB)
    train(root, "--config", "job.toml", "--data", "days/0", "--out-dir", "day0")
    return root


@pytest.mark.slow
def test_each_stretchs_last_checkpoint_stays_in_a_run_of_static_tables(days: Path) -> None:
    shutil.copytree(days / "day0", days / "kept")
    run_dir = days / "kept"
    (day0_end,) = checkpoint_steps(run_dir)[-1:]
    train(days, "--out-dir", "kept", "--continue-on", "days/1")
    # Day 1's checkpoints pruned day 0's last (checkpoint.keep = 2), which the README keeps.
    assert last_steps(run_dir)[0] == day0_end
    assert day0_end in checkpoint_steps(run_dir), checkpoint_steps(run_dir)
    train(days, "--out-dir", "kept", "--continue-on", "days/2")
    ends = last_steps(run_dir)
    assert len(ends) == 3 and set(ends) <= set(checkpoint_steps(run_dir)), checkpoint_steps(run_dir)
    done = subprocess.run(
        [sys.executable, "-m", "shardrec.tools.cli", "eval", "kept", "--checkpoint", str(day0_end)]
        + ["--nproc-per-node", "1", "--json"],
        cwd=days,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def killed(days: Path) -> Path:
    """`day0` gone on with day 1 and killed before that stretch's first checkpoint: the run's
    newest checkpoint is still day 0's last, its summary day 0's, stretches.json names day 1."""
    shutil.copytree(days / "day0", days / "killed")
    first = checkpoint_steps(days / "day0")[-1]
    fault = {"SHARDREC_FAULT": f"kill:{first + 1}"}
    assert train(days, "--out-dir", "killed", "--continue-on", "days/1", env=fault, ok=False)
    assert checkpoint_steps(days / "killed")[-1] == first
    assert last_steps(days / "killed") == [first, None]
    return days / "killed"


@pytest.mark.slow
def test_a_stretch_killed_before_its_first_checkpoint_is_finished_before_another(
    days: Path, killed: Path
) -> None:
    # --continue-on days/2 passed the launcher's checks; its rank 0 then failed 'checkpoint of
    # another model or optimizer: dataset: ... fingerprint ...'. So did `--data days/1` without
    # --continue-on, the killed stretch's own data.
    unfinished = (
        r"^error: killed: its current stretch \(on \S+days/1\) is not complete \(step [\d,]+\); "
        r"finish it first: rerun with --continue-on \S+days/1$"
    )
    with contextlib.chdir(days):
        for args in (
            ["--continue-on", "days/2"],
            ["--config", "job.toml", "--data", "days/1"],
            ["--config", "job.toml", "--data", "days/2"],
            [],
        ):
            refused = cli("train", "--out-dir", "killed", *args, "--nproc-per-node", "1", ok=False)
            assert_one_line_error(refused, unfinished)
    assert last_steps(killed) == [checkpoint_steps(killed)[-1], None]  # nothing written


def listed_status(root: Path, name: str) -> tuple[int | None, str]:
    rows = json.loads(cli("runs", str(root / name), "--json").stdout)
    (row,) = rows
    return row["step"], row["status"]


@pytest.mark.slow
def test_runs_lists_a_stretch_killed_before_its_first_checkpoint_as_unfinished(
    days: Path, killed: Path
) -> None:
    from shardrec.trainer.rundir.life.run_state import record_stop_at_once

    first = checkpoint_steps(killed)[-1]
    # It was listed as complete (its summary is the previous stretch's), while train refused it.
    assert listed_status(days, "killed") == (first, "failed")
    # A second signal in the stretch's first steps ends it at once, as the launcher records it.
    shutil.copytree(killed, days / "stopped")
    record_stop_at_once(days / "stopped", "SIGTERM")
    assert listed_status(days, "stopped") == (first, "stopped")
    train(days, "--out-dir", "stopped", "--continue-on", "days/1")  # begins the stretch again
    assert listed_status(days, "stopped")[1] == "complete"
    assert last_steps(days / "stopped") == [first, checkpoint_steps(days / "stopped")[-1]]
