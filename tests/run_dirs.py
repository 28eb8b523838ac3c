"""Run directories as the trainer leaves them, written without torch, for the tests of a run
directory's life (tests/unit/test_run_lifecycle_rules.py, tests/unit/test_run_status.py)."""

from __future__ import annotations

import json
from pathlib import Path

from shardrec.trainer.job.config import JobConfig, load_job_config


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
