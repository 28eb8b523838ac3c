"""`shardrec plan`'s proposed row budgets for managed tables: the job-file lines it prints work as
pasted. A named `[tables.FEATURE]` takes nothing from `[tables."*"]` (README, "Table kinds"), so
each printed table carries its whole settings, the proposed rows in place of the old."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
from helpers import assert_one_line_error, cli

from shardrec.trainer.job.config import load_job_config

JOB = """[train]
device = "cpu"
global_batch_size = 256

[tables."*"]
kind = "managed"
rows = 20000
admit_after = 2
max_age = "1 days"
"""


def _job_lines(printed: str) -> str:
    """What the plan prints after 'in the job file', up to its last line ('planned ...')."""
    after = printed.split("in the job file", 1)[1].split("\n", 1)[1]
    return after.split("\nplanned ", 1)[0] + "\n"


def _day(tmp_path: Path) -> None:
    cli("synth", "raw", "--like", "drift", "--days", "1", "--rows", "3000")
    cli("preprocess", "raw/day_0", "--out", "day0", "--raw-ids", "all")


def test_the_printed_row_budgets_pasted_into_the_job_file_plan(tmp_path: Path) -> None:
    with contextlib.chdir(tmp_path):
        _day(tmp_path)
        (tmp_path / "job.toml").write_text(JOB)
        first = cli("plan", "--data", "day0", "--config", "job.toml", "--world-size", "2")
        pasted = _job_lines(first.stdout)
        assert pasted.startswith("[tables]\nC1 = { kind = ")
        (tmp_path / "job.toml").write_text(JOB + "\n" + pasted)
        cli("plan", "--data", "day0", "--config", "job.toml", "--world-size", "2")
    tables = load_job_config(tmp_path / "job.toml").tables
    assert len(tables) == 27  # "*" and the 26 features, each named
    proposed = [line for line in pasted.splitlines() if line.startswith("C1 = ")][0]
    c1 = tables["C1"]
    assert f"rows = {c1.rows}," in proposed and c1.rows < 20000
    assert (c1.kind, c1.admit_after, c1.max_age, c1.policy) == ("managed", 2, "1 days", "lru")


def test_a_job_without_rows_gets_them_proposed_then_its_plan(tmp_path: Path) -> None:
    # rows left to `shardrec plan`, as its refusals say: it proposes them and writes no plan (a plan
    # of other rows would be refused by train); train refuses such a job naming the key.
    job = JOB.replace("rows = 20000\n", "")
    with contextlib.chdir(tmp_path):
        _day(tmp_path)
        (tmp_path / "job.toml").write_text(job)
        args = ["plan", "--data", "day0", "--config", "job.toml", "--world-size", "2"]
        first = cli(*args, "--out", "plan.json", ok=False)
        assert_one_line_error(
            first,
            r'^error: tables\."\*": no rows given, so no plan was made; put the proposed rows in '
            r"job.toml and run `shardrec plan` again$",
        )
        assert not (tmp_path / "plan.json").exists()
        pasted = first.stdout.split("in the job file", 1)[1].split("\n", 1)[1]
        assert pasted.startswith("[tables]\nC1 = { kind = ")
        refused = cli("train", "--config", "job.toml", "--data", "day0", "--out-dir", "r", ok=False)
        assert_one_line_error(refused, r"tables\.C1\.rows: not given; .*`shardrec plan --data DIR")
        (tmp_path / "job.toml").write_text(job + "\n" + pasted)
        cli(*args, "--out", "plan.json")
    assert (tmp_path / "plan.json").is_file()


def test_rows_left_to_plan_are_proposed_whole_where_they_fit(tmp_path: Path) -> None:
    # A job without rows plans its tables at 1 slot each; that placeholder must not price a slot:
    # at a memory that holds every table's wanted rows, the wanted rows are proposed (a slot was
    # priced as a 1-slot map, 1,460 B over 2 ranks instead of at most 404, and all were cut).
    job = JOB.replace("rows = 20000\n", "")
    with contextlib.chdir(tmp_path):
        _day(tmp_path)
        (tmp_path / "job.toml").write_text(job)
        args = ["plan", "--data", "day0", "--config", "job.toml", "--world-size", "2", "--json"]
        budgets = json.loads(cli(*args, ok=False).stdout)["row_budgets"]
        wanted = "[tables]\n" + "".join(
            f'{b["feature"]} = {{ kind = "managed", rows = {b["wanted"]}, max_age = "1 days" }}\n'
            for b in budgets
        )
        (tmp_path / "whole.toml").write_text(JOB + "\n" + wanted)
        whole = json.loads(cli(*args[:4], "whole.toml", *args[5:]).stdout)["estimate"]
        usable = whole["memory_capacity_bytes"] / whole["device_memory_bytes"]
        need = max(r["memory_bytes"] for r in whole["ranks"]) / usable * 1.002
        gib = ["--memory-gib", f"{need / 2**30:.6f}"]
        short = json.loads(cli(*args, *gib, ok=False).stdout)["row_budgets"]
        assert [(b["rows"], b["bytes_per_row"]) for b in short] == [
            (b["wanted"], 404.0) for b in budgets
        ]
        pasted = _job_lines(cli(*args[:-1], *gib, ok=False).stdout)
        (tmp_path / "job.toml").write_text(job + "\n" + pasted)
        cli(*args[:-1], *gib, "--out", "plan.json")
    assert (tmp_path / "plan.json").is_file()


@pytest.fixture(scope="module")
def day(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("drift")
    with contextlib.chdir(root):
        _day(root)
    return root / "day0"


@pytest.mark.parametrize(
    ("ranks", "gib"), [(2, "0.048"), (2, "0.04825"), (4, "0.0475"), (4, "0.04775")]
)
def test_rows_proposed_for_a_memory_pasted_plan_at_that_memory(
    tmp_path: Path, day: Path, ranks: int, gib: str
) -> None:
    # At these memories the proposal was priced on the plan of one slot a table, every table
    # data-parallel; at the proposed rows the planner shards them, with id and pooled-output
    # buffers, and the pasted rows were refused ('rank 0 needs 42.04 MiB of memory, 268.76 KiB
    # short'). Pasted, they plan, and the same rows are proposed again.
    job = tmp_path / "job.toml"
    args = ["plan", "--data", day, "--config", job, "--world-size", ranks, "--memory-gib", gib]
    job.write_text(JOB.replace("rows = 20000\n", ""))
    pasted = _job_lines(cli(*args, ok=False).stdout)
    assert pasted.startswith("[tables]\nC1 = { kind = ")
    job.write_text(JOB.replace("rows = 20000\n", "") + "\n" + pasted)
    planned = cli(*args)
    assert planned.exit_code == 0
    assert _job_lines(planned.stdout).strip() == pasted.strip()


def test_id_maps_past_the_memory_are_named_with_what_to_lower(tmp_path: Path) -> None:
    # On CPU the maps are in what every rank holds besides its tables: 20,000 slots a table make
    # most of it. The refusal said '(dense layers, framework) needs ...: raise memory per rank'.
    with contextlib.chdir(tmp_path):
        _day(tmp_path)
        (tmp_path / "job.toml").write_text(JOB)
        args = ["plan", "--data", "day0", "--config", "job.toml", "--world-size", "2"]
        refused = cli(*args, "--memory-gib", "0.05", ok=False)
    assert_one_line_error(
        refused,
        r"\(what every rank holds besides its tables \(dense layers, framework, the managed "
        r"tables' id maps: \d+\.\d\d MiB\) needs \d+\.\d\d MiB, more than the 43\.52 MiB usable: "
        r"lower the managed tables' rows or raise memory per rank\)$",
    )
