"""The user flow end to end, as `make demo` runs it, on a small synthetic dataset:
synth -> preprocess -> data stats -> plan -> train on 2 ranks through torchrun -> evaluate.

The commands that start no ranks run in this process (an interpreter start and torch's import
saved each); train runs as the user runs it."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.tools.cli.app import app


def shardrec(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shardrec.tools.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_synth_preprocess_plan_train_evaluate(tmp_path: Path):
    repo = Path(__file__).resolve().parents[2]
    steps = [
        ("synth", str(tmp_path / "raw"), "--rows", "40000", "--seed", "3"),
        (
            "preprocess",
            str(tmp_path / "raw" / "train.txt"),
            "--out",
            str(tmp_path / "data"),
            "--max-ids",
            "5000",
        ),
        ("data", "stats", str(tmp_path / "data"), "--json"),
        (
            "plan",
            "--data",
            str(tmp_path / "data"),
            "--config",
            str(repo / "configs/demo.toml"),
            "--world-size",
            "2",
            "--topology",
            "cpu-gloo",  # demo.toml trains on CPU ranks, whatever this machine has
            "--out",
            str(tmp_path / "plan.json"),
        ),
        (
            "train",
            "--config",
            str(repo / "configs/demo.toml"),
            "--data",
            str(tmp_path / "data"),
            "--plan",
            str(tmp_path / "plan.json"),
            "--out-dir",
            str(tmp_path / "run"),
            "--nproc-per-node",
            "2",
            "--steps",
            "30",
            "--json",
        ),
    ]
    for args in steps[:-1]:
        with contextlib.chdir(tmp_path):
            result = CliRunner().invoke(app, list(args))
        assert result.exit_code == 0, (
            f"shardrec {' '.join(args)} failed:\n{result.output}\n{result.exception!r}"
        )
    done = shardrec(*steps[-1], cwd=tmp_path)
    assert done.returncode == 0, (
        f"shardrec {' '.join(steps[-1])} failed:\n{done.stdout}\n{done.stderr}"
    )

    plan = json.loads((tmp_path / "plan.json").read_text())
    types = {t["sharding_type"] for t in plan["tables"]}
    assert {"table_wise", "row_wise", "column_wise"} <= types
    run = tmp_path / "run"
    assert (run / "plan.json").is_file() and (run / "config.toml").is_file()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r.get("kind") == "eval"]
    assert {r["split"] for r in evals} >= {"val", "test"}
    # 30 steps on 40k rows already learn the hidden model well past chance.
    assert all(r["auc"] > 0.6 for r in evals), evals


def test_bad_dataset_directory_is_one_clear_line(tmp_path: Path):
    # In this process (plan imports torchrec before it reads the data): the deliberate exit and
    # the one line on stderr are checked as for every bad input.
    result = CliRunner().invoke(
        app,
        ["plan", "--data", str(tmp_path), "--world-size", "2", "--out", str(tmp_path / "p.json")],
    )
    assert_one_line_error(result, "not a shardrec dataset")
