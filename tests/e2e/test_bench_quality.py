"""`shardrec bench quality`: managed vs hashed vs unbounded tables on a drifting log, day by day."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.tools.bench.train.quality_arms import MANAGED, run_name
from shardrec.tools.cli.app import app


@pytest.mark.slow
def test_bench_quality_trains_every_arm_day_by_day_with_the_managed_settings_given(tmp_path):
    """Two small days on one rank: each arm's progressive validation of day 1, the settings the
    managed arm ran with, and its runs kept apart from the default settings' under --work."""
    args = ["bench", "quality", "--days", "2", "--rows-per-day", "4000", "--seeds", "1"]
    args += ["--nproc-per-node", "1", "--work", str(tmp_path), "--json"]
    lru = 'policy="lru", max_age="1 days"'
    result = CliRunner().invoke(app, [*args, "--managed", lru])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["managed_settings"] == lru
    assert set(report["arms"]) == {"managed", "hashed", "unbounded"}
    for arm in report["arms"].values():
        assert len(arm["per_day"]) == 1 and 0.5 < arm["mean_pv_auc"] < 1
    # The shared row takes the ids without a slot: a share of the lookups, never all of them.
    assert all(0 < day["shared_row_share"] < 1 for day in report["managed_maps_per_day"])
    runs = {p.name for p in (tmp_path / "runs").iterdir()}
    assert runs == {"hashed-seed1", "unbounded-seed1", run_name("managed", 1, lru)}
    assert run_name("managed", 1, lru) != run_name("managed", 1, MANAGED)


def test_a_managed_setting_a_table_would_refuse_is_one_line_before_any_data(tmp_path):
    args = ["bench", "quality", "--work", str(tmp_path), "--managed", 'policy="mru"']
    result = CliRunner().invoke(app, args)
    assert_one_line_error(
        result,
        r"^error: --managed 'policy=\"mru\"': .*policy = 'mru' is not one of lru, lfu, age; "
        r"did you mean lru\?$",
    )
    assert list(tmp_path.iterdir()) == []


def test_too_few_rows_a_day_for_any_raw_id_table_is_one_line_before_any_data(tmp_path):
    """Under 1,000 distinct ids no table keeps raw ids: the three arms would be one static model."""
    args = ["bench", "quality", "--days", "2", "--rows-per-day", "1000", "--seeds", "1"]
    result = CliRunner().invoke(app, [*args, "--work", str(tmp_path)])
    assert_one_line_error(
        result,
        r"^error: --rows-per-day 1000: bench quality needs >= 1,500 rows a day, .*1,000 distinct ids",
    )
    assert list(tmp_path.iterdir()) == []


def test_a_log_whose_tables_stay_under_1000_distinct_ids_is_one_line_before_training(tmp_path):
    args = ["bench", "quality", "--days", "2", "--rows-per-day", "1500", "--max-vocab", "50"]
    result = CliRunner().invoke(app, [*args, "--seeds", "1", "--work", str(tmp_path)])
    assert_one_line_error(
        result,
        r"^error: no table of the drifting log has 1,000 distinct ids over 2 days of 1,500 rows "
        r"\(the most: \d+\): .* give more --rows-per-day or --days, or a larger --max-vocab$",
    )
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_rerun_with_the_same_work_reuses_its_runs_and_retrains_runs_of_other_settings(tmp_path):
    """--work's help: a rerun reuses the data and runs. A run trained on every day with the same
    settings is read back as it is; one of other settings (here --batch) is trained anew, never
    refused with options of `shardrec train` that bench quality lacks."""
    args = ["bench", "quality", "--days", "2", "--rows-per-day", "1500", "--seeds", "1"]
    args += ["--nproc-per-node", "1", "--work", str(tmp_path), "--json"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    stretches = sorted((tmp_path / "runs").glob("*/stretches.json"))
    written = [p.stat().st_mtime_ns for p in stretches]
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout) == json.loads(first.stdout)
    assert [p.stat().st_mtime_ns for p in stretches] == written  # read back, not retrained
    other = CliRunner().invoke(app, [*args, "--batch", "256"])
    assert other.exit_code == 0, other.output
    assert "--restart" not in other.output and "--out-dir" not in other.output
    assert [p.stat().st_mtime_ns for p in stretches] != written


def test_a_rerun_with_another_log_size_preprocesses_its_days_anew(tmp_path):
    """The days under --work are reused only when made of the same log: a rerun with other
    --rows-per-day must not train on the earlier run's days."""
    from shardrec.tools.bench.train.quality_bench import prepare

    first = prepare(tmp_path, 2, 1500, 0, 100_000)
    made = [(Path(d) / "manifest.json").stat().st_mtime_ns for d in first.days]
    assert prepare(tmp_path, 2, 1500, 0, 100_000).days == first.days
    assert [(Path(d) / "manifest.json").stat().st_mtime_ns for d in first.days] == made
    prepare(tmp_path, 2, 2000, 0, 100_000)
    assert [(Path(d) / "manifest.json").stat().st_mtime_ns for d in first.days] != made
