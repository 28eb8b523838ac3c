"""`shardrec runs` lists a run whose newest checkpoint cannot be read (a file saved cut short, so
it matches its digests) as damaged, naming the file, as `train` and `eval` refuse it before any
rank starts: before, it was listed as complete (or failed) while both refused it."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from typer.testing import CliRunner

from shardrec.tools.cli.app import app
from shardrec.trainer.rundir.checkpoint.trust import write_digests

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run-killed-at-step-6"
"""A run of 2 ranks killed after step 6, its one checkpoint of step 4 (tests/fixtures/README.md)."""


def test_runs_lists_a_run_whose_newest_checkpoint_was_saved_cut_short_as_damaged(tmp_path: Path):
    run = tmp_path / "runs" / "a"
    shutil.copytree(FIXTURE, run)
    hour_ago = time.time() - 3600  # no job writes it
    os.utime(run / "metrics.jsonl", (hour_ago, hour_ago))
    checkpoint = run / "checkpoints" / "step-00000004"
    shard = checkpoint / "__0_0.distcp"
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[: size // 2])
    write_digests(checkpoint)  # cut before its digests were written: it matches them
    listed = CliRunner().invoke(app, ["runs", str(run), "--json"])
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout)[0]["status"] == "damaged"
    shown = CliRunner().invoke(app, ["runs", str(run)])
    assert shown.stdout.splitlines()[-1] == (
        f"damaged: {checkpoint}: a file of this checkpoint is truncated or unreadable "
        f"(__0_0.distcp: {size // 2:,} bytes, .metadata says {size:,}), though it matches its "
        "digests (it was saved that way); refusing the checkpoint (this run has no other "
        "checkpoint)"
    )
