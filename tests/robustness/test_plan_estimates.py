"""A plan's memory estimate is checked against the plan's own shards (README, Failures and trust:
a plan estimated for another sparse optimizer; that case is test_plan_for_another_job.py's): the
fingerprint does not hold them, and the estimate is the run's plan.json and, on CUDA, what the fit
check at start compares with each device's free memory."""

from __future__ import annotations

import json
import re
from pathlib import Path

from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.tools.cli.app import app

runner = CliRunner()
JOB = ["--set", "train.global_batch_size=64", "--set", 'train.device="cpu"']


def test_a_plan_whose_shards_were_recut_by_hand_is_refused_for_its_stale_estimate(
    tiny_dataset: Path, tmp_path: Path
):
    """A column-wise table's 2 blocks of 8 re-cut into 4 blocks of 4 (a layout train accepts) left
    the estimate of 2 blocks of row-wise Adagrad state (4 B a row a block), and the plan was
    refused as 'the plan's memory estimate counts another sparse optimizer's state' though the
    job's optimizer was the plan's: the shards changed, not the optimizer."""
    path = tmp_path / "plan.json"
    pinned = ["--set", 'sharding.constraints={t_f0 = {sharding_types = ["column_wise"]}}']
    planned = runner.invoke(
        app,
        ["plan", "--data", str(tiny_dataset), "--world-size", "2", "--out", str(path), *JOB,
         *pinned],
    )  # fmt: skip
    assert planned.exit_code == 0, planned.output
    raw = json.loads(path.read_text())
    (table,) = [t for t in raw["tables"] if t["name"] == "t_f0"]
    assert [s["cols"] for s in table["shards"]] == [8, 8]
    table["shards"] = [
        {**table["shards"][0], "rank": block % 2, "col_offset": 4 * block, "cols": 4}
        for block in range(4)
    ]
    path.write_text(json.dumps(raw))
    result = runner.invoke(
        app,
        ["train", "--data", str(tiny_dataset), "--plan", str(path), "--out-dir", str(tmp_path / "run"),
         "--nproc-per-node", "2", *JOB, *pinned],
    )  # fmt: skip
    assert_one_line_error(
        result,
        "^error: "
        + re.escape(
            f"{path}: the plan's memory estimate does not match its shards (edited since it was "
            "planned?): rank 0 holds 5.30 KiB of optimizer state by the estimate, optim.sparse = "
            "'rowwise_adagrad' on the shards the file gives needs 5.50 KiB (re-run `shardrec "
            "plan` with this job's settings; for a layout of your own, pin it with "
            "sharding.constraints and plan again)"
        )
        + "$",
    )
    assert not (tmp_path / "run" / "checkpoints").exists()
