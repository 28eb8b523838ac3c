"""A dataset whose spec made no categorical or list column (a log of `user,item,rating` whose
integer columns spec infer proposed as dense numbers): spec infer says so in a warning, and plan
and train refuse such data in one line that says what to change. Before, infer said nothing and
both ended in "error: max() arg is an empty sequence" (the planner's search over no tables), train
after starting its ranks ("training failed: rank 0: ...")."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import assert_one_line_error, cli


def _log(path: Path) -> Path:
    rows = "".join(f"{i % 37},{i % 101},{1 + i % 5}\n" for i in range(700))
    path.write_text("user,item,rating\n" + rows)
    return path


def test_spec_infer_warns_of_a_proposal_without_a_column_of_ids(tmp_path: Path) -> None:
    log, spec = _log(tmp_path / "ui.csv"), tmp_path / "ui.toml"
    result = cli("spec", "infer", log, "--label", "rating>=4", "--out", spec)
    line = (
        "no column proposed as categorical or list, so the model would have no embedding table "
        "(plan and train refuse such data): a column of ids written as numbers (here user, item, "
        'proposed dense) wants role = "categorical", kind = "integer" and a hash_size'
    )
    assert result.stderr.splitlines() == [f"warning: {log}: {line}"]
    assert f"# {line}\n" in spec.read_text()


def test_plan_and_train_of_a_dataset_without_tables_say_what_to_change(tmp_path: Path) -> None:
    log, spec, data = _log(tmp_path / "ui.csv"), tmp_path / "ui.toml", tmp_path / "ui"
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
