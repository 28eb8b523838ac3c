"""`shardrec bench train`: ours (fp32, bf16, from disk and in memory) against stock torchrec, with
AUCs for the same steps; a tiny run checks the report, not the speed (benchmarks are not timed
tests)."""

from __future__ import annotations

import json

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.tools.cli.app import app


@pytest.mark.slow
def test_bench_train_reports_every_variant_ratio_and_auc() -> None:
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "train",
            "--model",
            "demo",
            "--steps",
            "3",
            "--rounds",
            "2",
            "--quality-steps",
            "3",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["model"] == "demo" and report["ranks"] == 2 and report["threads_per_rank"] == 1
    assert set(report["median_samples_per_s"]) == {
        "stock_fp32",
        "ours_fp32",
        "ours_fp32_in_memory",
        "ours_bf16",
    }
    assert all(rate > 0 for rate in report["median_samples_per_s"].values())
    for key in (
        "ours_fp32_vs_stock_fp32",
        "ours_bf16_vs_stock_fp32",
        "ours_bf16_vs_ours_fp32",
        "loader_vs_in_memory",
    ):
        assert report[key] > 0, key
    aucs = report["val_auc"]
    assert set(aucs) == {"stock_fp32", "ours_fp32", "ours_bf16"} and all(
        0 < a < 1 for a in aucs.values()
    )
    assert report["bf16_auc_within_tolerance"] == (
        abs(aucs["ours_bf16"] - aucs["ours_fp32"]) <= 0.002
    )
    # torchrec's planner on CPU picks among what its policy allows there (never row-wise).
    assert report["sharding_types"]["stock"] and "row_wise" not in report["sharding_types"]["stock"]


def test_bench_train_refuses_an_unknown_model() -> None:
    result = CliRunner().invoke(app, ["bench", "train", "--model", "huge"])
    assert_one_line_error(result, r"--model 'huge' is not one of reference, demo")
