"""`shardrec bench quality`: managed vs hashed vs unbounded tables on a drifting log, day by day."""

from __future__ import annotations

import json

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.tools.bench.train.quality_bench import MANAGED, run_name
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
        result, r"^error: --managed 'policy=\"mru\"': .*policy = 'mru' is not one of lru, lfu, age$"
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
