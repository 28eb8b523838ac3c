"""Plan files and calibration profiles are read by type (README, Failures and trust: Plan files). A
plan whose fingerprint is a string ended `shardrec train` in an AttributeError traceback, shard
fields of the wrong type failed only inside the ranks, and a profile holding NaN, Infinity or
`true` was taken as measured figures (the plan printed `max_step_ms: nan`)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
from helpers import assert_one_line_error, run_direct_rank
from typer.testing import CliRunner

from shardrec.tools.cli.app import app

runner = CliRunner()
JOB = ["--set", "train.global_batch_size=64", "--set", 'train.device="cpu"']


def _valid_plan(tiny_dataset: Path, path: Path) -> dict:
    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.embeddings.tables import build_table_configs
    from shardrec.sharding.plan.plan_file import plan_fingerprint, save_plan
    from shardrec.sharding.plan.plan_types import PLAN_SCHEMA_VERSION, PlanFile, Shard, TablePlan

    configs = build_table_configs(Manifest.load(tiny_dataset), 16)
    plan = PlanFile(
        PLAN_SCHEMA_VERSION,
        plan_fingerprint(configs, 1, 64, "cpu"),
        [
            TablePlan(c.name, "table_wise", "fused", [Shard(0, 0, 0, c.num_embeddings, 16)])
            for c in configs
        ],
    )
    save_plan(plan, path)
    return json.loads(path.read_text())


def _set(raw: dict, key: str, value) -> None:
    """raw[a][b][0][c] = value for key "a.b.0.c"."""
    *parents, last = [int(k) if k.isdigit() else k for k in key.split(".")]
    for k in parents:
        raw = raw[k]
    raw[last] = value


BAD_PLANS = [
    ("fingerprint", "abc", r"fingerprint is 'abc', expected an object"),
    ("fingerprint.world_size", "1", r"fingerprint.world_size is '1', expected an integer"),
    (
        "fingerprint.tables.0.rows",
        50.5,
        r"fingerprint.tables\[0\].rows is 50.5, expected an integer >= 0",
    ),
    ("tables", {"t_f0": 1}, r"tables is \{'t_f0': 1\}, expected a list"),
    (
        "tables.0.shards.0.rank",
        "0",
        r"tables\[0\].shards\[0\].rank is '0', expected an integer >= 0",
    ),
    (
        "tables.1.shards.0.rows",
        True,
        r"tables\[1\].shards\[0\].rows is True, expected an integer >= 0",
    ),
    (
        "tables.2.shards.0.col_offset",
        -1,
        r"tables\[2\].shards\[0\].col_offset is -1, expected an integer >= 0",
    ),
    ("tables.0.name", 7, r"tables\[0\].name is 7, expected a string"),
    ("tables.0.shards", "all", r"tables\[0\].shards is 'all', expected a list"),
    ("schema_version", True, r"schema_version True is not supported"),
    ("estimate", float("nan"), r"estimate is NaN, not a finite number"),
    (
        "tables.3.shards.0.cols",
        float("inf"),
        r"tables\[3\]\.shards\[0\]\.cols is Infinity, not a finite number",
    ),
]


def test_plan_files_and_calibration_profiles_are_checked_by_type(
    tiny_dataset: Path, tmp_path: Path
):
    good = tmp_path / "good.json"
    raw = _valid_plan(tiny_dataset, good)
    assert runner.invoke(app, ["plan", "show", str(good)]).exit_code == 0
    for key, value, message in BAD_PLANS:
        bad = json.loads(json.dumps(raw))
        _set(bad, key, value)
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))  # json.dumps writes NaN and Infinity as they are
        pattern = "^error: " + re.escape(str(path)) + ": " + message
        assert_one_line_error(runner.invoke(app, ["plan", "show", str(path)]), pattern)
        result = runner.invoke(
            app,
            [
                "train",
                "--data",
                str(tiny_dataset),
                "--plan",
                str(path),
                "--out-dir",
                str(tmp_path / "run"),
                *JOB,
            ],
        )
        assert_one_line_error(result, re.escape(str(path)) + ": " + message)
        assert not (tmp_path / "run" / "checkpoints").exists()

    profile = tmp_path / "profile.json"
    figures = {"lookup_bw": 1.5e9, "intra_host_bw": 3e8, "inter_host_bw": 1e8}
    profile.write_text(json.dumps({"format": "shardrec-calibration", "measured": figures}))
    planned = runner.invoke(
        app,
        [
            "plan",
            "--data",
            str(tiny_dataset),
            "--world-size",
            "2",
            "--profile",
            str(profile),
            "--json",
        ],
    )
    assert planned.exit_code == 0, planned.output
    assert json.loads(planned.stdout)["max_step_ms"] > 0
    for value, message in [
        ("NaN", "measured.lookup_bw is NaN, not a finite number"),
        ("Infinity", "measured.lookup_bw is Infinity, not a finite number"),
        ("-Infinity", "measured.lookup_bw is -Infinity, not a finite number"),
        ("true", "measured.lookup_bw is True, expected a number"),
        ('"1.5e9"', "measured.lookup_bw is '1.5e9', expected a number"),
        ("[1]", r"measured.lookup_bw is \[1\], expected a number"),
    ]:
        profile.write_text(
            f'{{"format": "shardrec-calibration", "measured": {{"lookup_bw": {value}, "intra_host_bw": 3e8}}}}'
        )
        result = runner.invoke(
            app,
            ["plan", "--data", str(tiny_dataset), "--world-size", "2", "--profile", str(profile)],
        )
        assert_one_line_error(result, "^error: " + re.escape(str(profile)) + ": " + message)


BAD_RECORDS = [
    ("topology.memory_bytes", "4", r"topology.memory_bytes is '4', expected an integer >= 0"),
    ("topology.lookup_bw", None, r"topology.lookup_bw is missing"),
    ("topology.memory_bytes", 0, r"topology h100: memory per rank is 0 bytes; it must be > 0"),
    ("estimate.ranks", "x", r"estimate.ranks is 'x', expected a list"),
    ("estimate.ranks.1", 3, r"estimate.ranks\[1\] is 3, expected an object"),
    (
        "estimate.ranks.0.step_ms",
        "fast",
        r"estimate.ranks\[0\].step_ms is 'fast', expected a number",
    ),
    (
        "estimate.ranks.0.bytes_sent",
        [],
        r"estimate.ranks\[0\].bytes_sent is \[\], expected an object",
    ),
    ("estimate.sync_every", -1, r"estimate.sync_every is -1, expected an integer >= 0"),
]


def test_a_plans_topology_and_estimate_are_read_by_type(tmp_path: Path):
    raw = json.loads(
        (
            Path(__file__).resolve().parents[1] / "fixtures" / "plans" / "h100-2d-world4.json"
        ).read_text()
    )
    for key, value, message in BAD_RECORDS:
        bad = json.loads(json.dumps(raw))
        if value is None:
            section, name = key.split(".")
            del bad[section][name]
        else:
            _set(bad, key, value)
        path = tmp_path / "bad.json"
        path.write_text(json.dumps(bad))
        pattern = "^error: " + re.escape(str(path)) + ": " + message
        assert_one_line_error(runner.invoke(app, ["plan", "show", str(path)]), pattern)


@pytest.mark.parametrize("text", ["", "{", "\xff\xfe"], ids=["empty", "torn", "not-utf8"])
def test_an_unreadable_plan_file_is_named(tmp_path: Path, text: str):
    path = tmp_path / "plan.json"
    path.write_bytes(text.encode("latin-1"))
    assert_one_line_error(
        runner.invoke(app, ["plan", "show", str(path)]),
        "^error: " + re.escape(str(path)) + ": not a JSON plan file",
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda raw: raw["tables"][0]["shards"][0].update(rows=10),
            r"table t_f0: its shards \(rank 0: rows 0\.\.10, columns 0\.\.16\) are not a "
            r"table_wise layout of its \d+ x 16 weights on 1 ranks \(was the plan edited\? re-run "
            r"`shardrec plan`\)",
        ),
        (
            lambda raw: raw["tables"][1]["shards"][0].update(rank=5),
            r"table t_f1: shard on rank 5, world size is 1",
        ),
        (
            lambda raw: raw["tables"].pop(2),
            r"table t_f2: not in the plan \(was the plan edited\? re-run `shardrec plan`\)",
        ),
        (  # trained on one of the two, shown both by `plan show`
            lambda raw: raw["tables"].append(dict(raw["tables"][1])),
            r"table t_f1: listed twice \(re-run `shardrec plan`\)",
        ),
        (  # failed inside the ranks ("training failed: rank 1: ..."); `plan show` showed it
            lambda raw: raw["tables"][0].update(compute_kernel="foo"),
            r"table t_f0: compute_kernel 'foo' is not one of fused, dense, fused_uvm, "
            r"fused_uvm_caching \(re-run `shardrec plan`\)",
        ),
        (  # failed inside the ranks too (and data_parallel on fused read as another optimizer's)
            lambda raw: raw["tables"][0].update(compute_kernel="dense"),
            r"table t_f0: compute_kernel 'dense' with sharding_type 'table_wise': a data_parallel "
            r"table's kernel is dense, another's one of fused, fused_uvm, fused_uvm_caching "
            r"\(re-run `shardrec plan`\)",
        ),
    ],
    ids=["part-of-a-table", "rank-past-world", "table-gone", "table-twice", "kernel", "dense"],
)
def test_a_hand_edited_plan_is_refused_naming_the_plan_and_table(
    tiny_dataset: Path, tmp_path: Path, edit, message: str
):
    """Fields of the right types, but shards that are no layout of their sharding type (the
    fingerprint does not cover them): one line before any rank starts, not torchrec's traceback;
    `plan show` refuses it in the same line (it printed such a plan's tables as a plan)."""
    path = tmp_path / "plan.json"
    raw = _valid_plan(tiny_dataset, path)
    edit(raw)
    path.write_text(json.dumps(raw))
    pattern = "^error: " + re.escape(str(path)) + ": " + message + "$"
    result = runner.invoke(
        app,
        ["train", "--data", str(tiny_dataset), "--plan", str(path), "--out-dir", str(tmp_path / "run"),
         "--nproc-per-node", "1", *JOB],
    )  # fmt: skip
    assert_one_line_error(result, pattern)
    assert_one_line_error(runner.invoke(app, ["plan", "show", str(path)]), pattern)


def test_ranks_torchrun_starts_name_the_plan_file_of_a_bad_layout(
    tiny_dataset: Path, tmp_path: Path
):
    """`torchrun ... -m shardrec.trainer --plan P` checks the layout in the ranks, with no
    `shardrec train` before them; they said "error: table t_f0: its shards ..." without the file."""
    path = tmp_path / "plan.json"
    raw = _valid_plan(tiny_dataset, path)
    raw["tables"][0]["shards"][0].update(rows=10)
    path.write_text(json.dumps(raw))
    direct = run_direct_rank(
        "--data", str(tiny_dataset), "--plan", str(path), "--out-dir", str(tmp_path / "run"), *JOB
    )
    assert_one_line_error(
        direct,
        "^error: " + re.escape(f"{path}: table t_f0: its shards (rank 0: rows 0..10, columns "),
    )


@pytest.mark.parametrize(
    ("kind", "first", "second", "message"),
    [
        (
            "row_wise",
            {"rows": 30},
            {"rank": 1, "row_offset": 20, "rows": 30},
            r"table t_f0: its shards \(rank 0: rows 0\.\.30, columns 0\.\.16\) are not a row_wise "
            r"layout of its 50 x 16 weights on 2 ranks \(was the plan edited\? re-run "
            r"`shardrec plan`\)",
        ),
        (
            "column_wise",
            {"cols": 2},
            {"rank": 1, "col_offset": 2, "cols": 14},
            r"table t_f0: its shards \(rank 0: rows 0\.\.50, columns 0\.\.2\) are not a "
            r"column_wise layout of its 50 x 16 weights on 2 ranks",
        ),
    ],
    ids=["rows-overlap", "columns-narrow"],
)
def test_plan_show_refuses_a_hand_edited_layout_as_train_does(
    tiny_dataset: Path, tmp_path: Path, kind: str, first: dict, second: dict, message: str
):
    """`plan show` printed a plan whose shards overlap or whose column shards are 2 and 14
    columns wide (no layout torchrec builds) as a plan, exit 0; now the line `train` gives."""
    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.embeddings.tables import build_table_configs
    from shardrec.sharding.plan.plan_file import plan_fingerprint

    path = tmp_path / "plan.json"
    raw = _valid_plan(tiny_dataset, path)
    configs = build_table_configs(Manifest.load(tiny_dataset), 16)
    fingerprint = plan_fingerprint(configs, 2, 64, "cpu")  # the same tables on 2 ranks
    raw["fingerprint"] = dataclasses.asdict(fingerprint)
    shard = raw["tables"][0]["shards"][0]  # t_f0, made a `kind` table of two shards
    raw["tables"][0].update(sharding_type=kind, shards=[{**shard, **first}, {**shard, **second}])
    path.write_text(json.dumps(raw))
    result = runner.invoke(app, ["plan", "show", str(path)])
    assert_one_line_error(result, "^error: " + re.escape(str(path)) + ": " + message)
