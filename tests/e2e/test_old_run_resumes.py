"""A run directory written by the code before the trainer regroup still resumes: the on-disk
formats (config.toml, plan.json, dataset.json, metrics.jsonl, the checkpoint's files) did not
change. tests/fixtures/run-killed-at-step-6 is such a run: 2 ranks, killed after step 6, its
newest checkpoint of step 4 (tests/fixtures/README.md says how it was made). Its dataset was of
the layout before one file per part: the run refuses it in one line naming `shardrec data
upgrade`, and resumes on it once upgraded (the upgraded dataset keeps its fingerprint)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import write_tiny_dataset
from dataset_writing import write_old_layout
from helpers import TINY_MODEL, cli, settings, train_command

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# The settings the fixture was trained with; a resume refuses any other.
JOB = settings(
    *TINY_MODEL,
    "train.global_batch_size=64",
    "train.steps=8",
    "checkpoint.interval_steps=4",
    'data.eval_splits=["val"]',
    "eval.interval_steps=4",
    "checkpoint.keep=2",
)


def test_a_run_killed_under_the_previous_layout_resumes_and_ends_where_it_would_have(
    tmp_path: Path,
) -> None:
    write_tiny_dataset(tmp_path / "new")
    data = tmp_path / "data"  # the fixture's dataset: same bytes, same fingerprint
    write_old_layout(tmp_path / "new", data)
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "run-killed-at-step-6", run)
    refused = subprocess.run(
        train_command(data, run, *JOB), capture_output=True, text=True, timeout=300
    )
    assert refused.returncode == 1 and f"`shardrec data upgrade {data}`" in refused.stderr, (
        refused.stderr[-3000:]
    )
    upgraded = json.loads(cli("data", "upgrade", data, "--json").stdout)
    assert upgraded["from_version"] == 1 and upgraded["parts"] == 4
    result = subprocess.run(
        train_command(data, run, *JOB), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert (summary["resumed_from_step"], summary["steps"]) == (4, 8)
    # The uninterrupted run of the previous code: bitwise equal on the machine that made the
    # fixture.
    expected = json.loads((FIXTURES / "run-killed-at-step-6.expected.json").read_text())["eval"][
        "val"
    ]
    for key in ("auc", "logloss"):
        assert summary["eval"]["val"][key] == pytest.approx(expected[key], rel=1e-6), key
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in records if r["kind"] in ("eval", "resume")] == [
        ("eval", 4),
        ("resume", 4),
        ("eval", 8),
    ]
