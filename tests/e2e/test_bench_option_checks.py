"""bench sequence, plan-reality and preprocess refuse each bad option in one line naming the
option and its value (as bench train and loader do), before any data is made or rank started."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.tools.cli.app import app


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--rows", "10"], "--rows 10: must be >= 1000"),
        (
            ["--seeds", "1"],
            "--seeds 1: must be >= 2 (the AUCs' spread needs two runs of each model)",
        ),
        (["--steps", "-1"], "--steps -1: must be >= 0 (0: one epoch)"),
        # --nproc-per-node 0 is typer's range check, as train's and eval's
        # (tests/e2e/test_cli_commands.py).
    ],
)
def test_bench_sequence_names_the_one_bad_option(args: list[str], error: str) -> None:
    result = CliRunner().invoke(app, ["bench", "sequence", *args])
    assert_one_line_error(result, rf"^error: {re.escape(error)}$")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--world-size", "1"], "--world-size 1: must be >= 2"),
        (
            ["--global-batch-size", "1"],
            "--global-batch-size 1: must be >= 2 (a sample per rank of --world-size)",
        ),
        (
            ["--world-size", "3"],
            "--global-batch-size 2048: must be a multiple of --world-size (3), e.g. 2046",
        ),
        (["--steps", "0"], "--steps 0: must be >= 1"),
        (["--rounds", "0"], "--rounds 0: must be >= 1"),
        (["--tables", "0"], "--tables 0: must be >= 1"),
        (["--max-rows", "0"], "--max-rows 0: must be >= 1"),
        (["--dim", "0"], "--dim 0: must be >= 1"),
        (
            ["--memory-limit-gib", "-1"],
            "--memory-limit-gib -1: must be a finite number >= 0 (0: 80% of available)",
        ),
        (
            ["--memory-limit-gib", "nan"],
            "--memory-limit-gib nan: must be a finite number >= 0 (0: 80% of available)",
        ),
        (["--large", "--dim", "8"], "--dim does nothing with --large: leave it out"),
        (["--large", "--max-rows", "9"], "--max-rows does nothing with --large: leave it out"),
    ],
)
def test_bench_plan_reality_names_the_one_bad_option(args: list[str], error: str) -> None:
    result = CliRunner().invoke(app, ["bench", "plan-reality", *args])
    assert_one_line_error(result, rf"^error: {re.escape(error)}$")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--size-gb", "0"], "--size-gb 0: must be a finite number > 0"),
        (["--size-gb", "-0.5"], "--size-gb -0.5: must be a finite number > 0"),
        # typer takes nan and inf for a float: they ended in a traceback ('cannot convert float
        # NaN to integer'), or, --chunk-mb inf, a preprocess run still going after a minute
        (["--size-gb", "nan"], "--size-gb nan: must be a finite number > 0"),
        (["--size-gb", "inf"], "--size-gb inf: must be a finite number > 0"),
        (["--workers", "0"], "--workers 0: must be >= 1"),
        (["--chunk-mb", "0"], "--chunk-mb 0: must be a finite number > 0"),
        (["--chunk-mb", "nan"], "--chunk-mb nan: must be a finite number > 0"),
        (["--rounds", "0"], "--rounds 0: must be >= 1"),
        (["--gzip", "--like", "avazu"], "--like does nothing with --gzip: leave it out"),
        (["--gzip", "--like", "nope"], "--like does nothing with --gzip: leave it out"),
        (["--like", "nope"], "--like 'nope' is not one of criteo, movielens, avazu"),
    ],
)
def test_bench_preprocess_names_the_one_bad_option_before_making_data(
    args: list[str], error: str, tmp_path: Path
) -> None:
    command = ["bench", "preprocess", "--size-gb", "0.001", "--work-dir", str(tmp_path), *args]
    result = CliRunner().invoke(app, command)
    assert_one_line_error(result, rf"^error: {re.escape(error)}$")
    assert list(tmp_path.iterdir()) == []  # nothing generated
