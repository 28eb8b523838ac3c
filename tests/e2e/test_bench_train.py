"""`shardrec bench train`: ours (fp32, bf16, from disk and in memory) against stock torchrec, with
AUCs for the same steps; a tiny run checks the report, not the speed (benchmarks are not timed
tests)."""

from __future__ import annotations

import json
import re

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
            "--breakdown",
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
    assert all(rate > 0 for rate in report["samples_per_cpu_s"].values())
    # Windows of 3 steps measure their start and end: every ratio says so instead of a figure.
    for key in (
        "ours_fp32_vs_stock_fp32",
        "ours_bf16_vs_stock_fp32",
        "ours_bf16_vs_ours_fp32",
        "loader_vs_in_memory",
    ):
        assert report[key] == {"too_small": "3 steps a window, under 16", "rounds": 2}, key
    assert report["ours_compiled"] is False  # the demo's dense layers are too small to compile
    # --breakdown: each side's step (ours in both precisions) in categories that add up to it.
    assert set(report["breakdown"]) == {"stock_fp32", "ours_fp32", "ours_bf16"}
    for side in ("stock_fp32", "ours_fp32", "ours_bf16"):
        parts = report["breakdown"][side]
        wall = parts.pop("step wall")
        assert wall > 0 and sum(parts.values()) == pytest.approx(wall, rel=0.02), side
        assert parts["dense fwd"] > 0 and parts["lookups bwd"] > 0 and parts["all-to-all"] > 0
    assert report["breakdown"]["ours_fp32"]["loader"] > 0
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


@pytest.mark.slow
def test_bench_train_of_hstu_times_ours_against_the_plain_layer_on_two_ranks() -> None:
    """The HSTU bench end to end (its ranks once failed to import a timing helper the rounds harness
    had replaced: every run ended in the ranks' traceback)."""
    args = ["bench", "train", "--model", "hstu", "--rows", "3000", "--steps", "3", "--rounds", "1"]
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["median_samples_per_s"]) == {"ours", "plain_layer", "ours_from_disk"}
    assert all(rate > 0 for rate in report["median_samples_per_s"].values())
    # The same layer summed in another order: 0.0 on a Xeon with AMX, 3.9e-7 on an AMD EPYC (fp32
    # rounding); a layer computing something else differs by orders of magnitude more.
    assert set(report["max_logit_difference"]) == {"plain_layer"}
    assert report["max_logit_difference"]["plain_layer"] < 1e-5
    # 3 steps a window are too few to time: the run checks the report, not the speed.
    assert report["ours_vs_plain_layer"]["too_small"] == "3 steps a window, under 16"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--managed", "--breakdown"], "--breakdown does nothing with --managed"),
        (["--managed", "--reference", "."], "--reference does nothing with --managed"),
        (["--managed", "--quality-steps", "10"], "--quality-steps does nothing with --managed"),
        (["--rows", "5000"], "--rows does nothing without --model hstu"),
        (
            ["--reference", ".", "--quality-steps", "9"],
            "--quality-steps does nothing with --reference",
        ),
        (
            ["--model", "hstu", "--quality-steps", "10"],
            "--quality-steps does nothing with --model hstu",
        ),
    ],
)
def test_bench_train_refuses_a_flag_that_would_do_nothing(args: list[str], error: str) -> None:
    result = CliRunner().invoke(app, ["bench", "train", *args])
    assert_one_line_error(result, rf"^error: {re.escape(error)}")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--nproc", "0"], "--nproc-per-node 0: must be >= 1"),
        (["--steps", "1"], "--steps 1: must be >= 2"),
        (["--rounds", "0"], "--rounds 0: must be >= 1"),
        (["--threads", "0"], "--threads 0: must be >= 1"),
        (["--quality-steps", "0"], "--quality-steps 0: must be >= 1"),
        (["--model", "hstu", "--rows", "10"], "--rows 10: must be >= 1000"),
        (["--model", "hstu", "--nproc", "0"], "--nproc-per-node 0: must be >= 1"),
    ],
)
def test_bench_train_names_the_one_bad_option(args: list[str], error: str) -> None:
    result = CliRunner().invoke(app, ["bench", "train", *args])
    assert_one_line_error(result, rf"^error: {re.escape(error)}$")
