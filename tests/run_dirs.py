"""Run directories as the trainer leaves them, written without torch, for the tests of a run
directory's life (tests/unit/test_run_lifecycle_rules.py, tests/unit/test_run_status.py), and the
tiny job the e2e tours train them with (tests/e2e/test_run_lifecycle.py,
test_run_dir_refusals.py)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import TINY_MODEL, settings
from typer.testing import CliRunner, Result

from shardrec.trainer.job.config import JobConfig, load_job_config

LIFECYCLE_JOB = settings(
    'train.device="cpu"',
    *TINY_MODEL,
    "train.global_batch_size=64",
    'data.eval_splits=["val"]',
    "eval.max_batches=2",
)
"""The tiny job of the run-directory tours (tests/e2e/test_run_lifecycle.py,
test_run_dir_refusals.py)."""


def job_config(data: Path, *settings: str) -> JobConfig:
    """A job on `data` in batches of 64, with `settings` (`key=value`) on top."""
    return load_job_config(None, [f'data.path="{data}"', "train.global_batch_size=64", *settings])


def run_dir_as_left(
    tmp_path: Path,
    saved: JobConfig,
    step: int,
    summary: dict | None = None,
    records: list[dict] = (),
) -> Path:
    """A run directory as the trainer leaves it: config.toml, a complete checkpoint at `step`,
    summary.json when the invocation finished, metrics.jsonl's records."""
    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / f"step-{step:08d}"
    checkpoint.mkdir(parents=True)
    (checkpoint / "digests.json").write_text('{"files": {}}')  # what makes it complete
    (run / "config.toml").write_text(saved.to_toml())
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def train_in_process(data: Path, run: Path, *extra: str) -> Result:
    """`shardrec train` of LIFECYCLE_JOB (with `extra` flags) in this process."""
    from shardrec.tools.cli.app import app

    return CliRunner().invoke(
        app, ["train", "--data", str(data), "--out-dir", str(run), "--json", *LIFECYCLE_JOB, *extra]
    )
