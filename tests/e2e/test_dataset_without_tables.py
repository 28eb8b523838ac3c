"""A dataset whose spec made no categorical or list column (a log of `user,item,rating` whose
integer columns spec infer proposed as dense numbers): plan and train refuse it in one line that
says what to change. Before, both ended in "error: max() arg is an empty sequence" (the planner's
search over no tables), train after starting its ranks ("training failed: rank 0: ...")."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import assert_one_line_error, cli


def test_plan_and_train_of_a_dataset_without_tables_say_what_to_change(tmp_path: Path) -> None:
    log, spec, data = tmp_path / "ui.csv", tmp_path / "ui.toml", tmp_path / "ui"
    log.write_text(
        "user,item,rating\n" + "".join(f"{i % 37},{i % 101},{1 + i % 5}\n" for i in range(700))
    )
    spec.write_text(
        '[format]\nkind = "csv"\nheader = true\n[[columns]]\nname = "user"\nrole = "dense"\n'
        '[[columns]]\nname = "item"\nrole = "dense"\n'
        '[[columns]]\nname = "rating"\nrole = "label"\nthreshold = 4\n'
    )
    cli("preprocess", log, "--spec", spec, "--out", data)
    said = (
        rf"^error: --data {re.escape(str(data))}: no categorical or list feature, so no embedding "
        r"table to train: its spec gives every column the role label, dense or ignore; give the "
        r"columns of ids \(users, items, \.\.\.\) role = \"categorical\" \(kind = \"integer\" for "
        r"numbers\) and preprocess again$"
    )
    assert_one_line_error(
        cli("plan", "--data", data, "--world-size", "1", "--set", "train.global_batch_size=64",
            ok=False),
        said,
    )  # fmt: skip
    run = tmp_path / "run"
    assert_one_line_error(
        cli("train", "--data", data, "--out-dir", run, "--nproc-per-node", "1", "--set",
            "train.global_batch_size=64", ok=False),
        said,
    )  # fmt: skip
    assert not run.exists()
