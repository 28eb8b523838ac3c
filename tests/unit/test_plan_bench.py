"""`shardrec bench plan`: shardrec's plan against torchrec's on the benchmark's cases, priced by
both cost models, and on a CPU case trained, its ratio the median of same-round ratios."""

from __future__ import annotations

import json
import re

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.tools.cli.app import app

runner = CliRunner()


@pytest.mark.slow
def test_bench_plan_runs_one_case() -> None:
    res = runner.invoke(app, ["bench", "plan", "--only", "random40", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout[res.stdout.index("{") :])
    (case,) = out["cases"]
    assert case["shardrec_fits"] and case["torchrec_fits"]
    # The headline is torchrec's estimators' ratio of the two plans, both reserving the same memory.
    assert case["ratio_torchrec_estimators"] == pytest.approx(
        case["shardrec_torchrec_ms"] / case["torchrec_torchrec_ms"]
    )
    assert out["geomean_ratio_torchrec_estimators"] == pytest.approx(
        case["ratio_torchrec_estimators"]
    )
    assert 0.5 < case["ratio_torchrec_estimators"] <= 1.0
    assert (
        0 < case["ratio_shardrec_model"] <= 1.0
        and case["ratio_default_plan_torchrec_estimators"] > 0
    )
    # The headline: the plan `shardrec plan` writes (shardrec's cost model on CUDA by default) vs
    # torchrec's, under it.
    assert (
        case["cost_model"] == "shardrec" and case["ratio_headline"] == case["ratio_shardrec_model"]
    )
    assert "ratio_measured" not in case  # a CUDA case: nothing trained here
    assert (
        out["reserve"] == 0.15 and "FixedPercentageStorageReservation(0.15)" in out["reservation"]
    )
    # One text run also takes --reserve 0 (each run plans the case again): the reservation it prints
    # is the JSON's "reservation", made from the reserve it ran with.
    res = runner.invoke(app, ["bench", "plan", "--only", "random40", "--reserve", "0"])
    assert res.exit_code == 0, res.output
    assert (
        "both planners keep 0% of each rank's memory free (torchrec: FixedPercentageStorageReservation(0.0); "
        "shardrec: plans for 100% of the memory)" in " ".join(res.stdout.split())
    ), res.stdout
    assert (
        res.stdout.strip()
        .splitlines()[-1]
        .startswith(
            "headline (the plan `shardrec plan` writes vs torchrec's, priced by shardrec's cost model, "
            "the default: no --profile measured which is better): geomean 0."
        )
    )
    res = runner.invoke(app, ["bench", "plan", "--reserve", "1"])
    assert_one_line_error(res, re.escape("--reserve must be in [0, 1) (got 1.0)"))
    res = runner.invoke(app, ["bench", "plan", "--only", "no-such-case"])
    assert_one_line_error(res, re.escape("matches no case"))


@pytest.mark.slow
def test_bench_plan_trains_both_plans_of_a_cpu_case() -> None:
    from shardrec.tools.bench.plan.plan_bench import Case, run_case

    row = run_case(Case("small/cpu-gloo x2", "random:4:6:1e4", "cpu-gloo", 2, 512))
    assert row["cost_model"] == "shardrec" and row["ratio_headline"] == row["ratio_shardrec_model"]
    assert row["measured_shardrec_ms"] > 0 and row["measured_torchrec_ms"] > 0
    # Through the rounds harness: a median with its spread, or why there is no figure.
    measured = row["measured"]
    assert measured["rounds"] == 3
    if "too_small" in measured:
        assert row["ratio_measured"] is None
    else:
        assert measured["low"] <= measured["median"] <= measured["high"]
        assert row["ratio_measured"] == pytest.approx(measured["median"], abs=5e-4)


def test_the_trained_plan_ratio_is_the_median_of_same_round_ratios_after_a_warm_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shardrec.tools.bench.plan import plan_bench, reality

    seen: dict = {}

    def measure_plans(configs, texts, **kw):
        seen.update(kw)
        # Round 0 is the warm-up (a fresh process's one-off costs): it must not count.
        ours = reality.Measured(0.05, [], [], [], [9.0, 0.050, 0.060, 0.045])
        theirs = reality.Measured(0.1, [], [], [], [0.1, 0.100, 0.100, 0.090])
        return ours, theirs

    monkeypatch.setattr(reality, "measure_plans", measure_plans)
    case = plan_bench.Case("small/cpu-gloo x2", "random:4:6:1e4", "cpu-gloo", 2, 512)
    row = plan_bench.run_case(case)
    assert seen["rounds"] == plan_bench.MEASURE_ROUNDS + 1 == 4
    # Same-round ratios 0.5, 0.6, 0.5: the median and the spread; step times as medians.
    assert row["measured"] == {
        "median": 0.5, "low": 0.5, "high": 0.6, "spread": 0.2, "rounds": 3
    }  # fmt: skip
    assert row["ratio_measured"] == 0.5
    assert (row["measured_shardrec_ms"], row["measured_torchrec_ms"]) == (50.0, 100.0)
    plan_bench.print_plan_table(plan_bench._summary([row], 0.15))


def test_a_trained_plan_ratio_of_short_runs_is_too_small_to_measure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from shardrec.tools.bench.plan import plan_bench, reality

    short = reality.Measured(0.001, [], [], [], [0.001] * 4)  # 8 steps of 1 ms: 8 ms a run
    monkeypatch.setattr(reality, "measure_plans", lambda configs, texts, **kw: (short, short))
    case = plan_bench.Case("small/cpu-gloo x2", "random:4:6:1e4", "cpu-gloo", 2, 512)
    row = plan_bench.run_case(case)
    assert row["ratio_measured"] is None and "under 0.2 s" in row["measured"]["too_small"]
    assert plan_bench._summary([row], 0.15)["cases_ratio_measured"] == 0
