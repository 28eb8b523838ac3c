"""The GPU check (scripts/gpu_check.sh, `make gpu-check`): without CUDA it says so in one line and
exits 3; its summary ends in one verdict; `bench train --device cuda` refuses a machine without GPUs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.tools.bench import gpu_check
from shardrec.tools.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
NO_CUDA_LINE = "gpu check: no CUDA device was found"


@no_cuda
def test_script_without_cuda_prints_one_line_and_exits_3() -> None:
    result = subprocess.run([str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True, timeout=120)
    assert result.returncode == gpu_check.NO_CUDA == 3, result.stderr
    assert result.stdout.splitlines() == [result.stdout.strip()] and result.stdout.startswith(NO_CUDA_LINE)
    assert result.stderr == ""


@no_cuda
def test_module_without_cuda_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main() == 3
    assert capsys.readouterr().out.startswith(NO_CUDA_LINE)


@no_cuda
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_target_runs_the_script() -> None:
    result = subprocess.run(["make", "-s", "gpu-check"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and result.stdout.startswith(NO_CUDA_LINE)


def test_summary_ends_in_one_verdict() -> None:
    rows = [
        gpu_check.Row("pytest -m gpu", True, "3 passed, 0 failed, 0 skipped", 41.0),
        gpu_check.Row("bench train cuda x2 bf16", False, "AUC 0.7000 (NOT within 0.002)", 0.0),
    ]
    lines = gpu_check.summary_table(rows, "2 x H200").splitlines()
    assert lines[0] == "GPU check on 2 x H200"
    assert lines[2].split()[:5] == ["pytest", "-m", "gpu", "PASS", "41"]
    assert "FAIL" in lines[3] and lines[-1].split() == ["overall", "FAIL"]
    assert gpu_check.summary_table(rows[:1], "x").splitlines()[-1].split() == ["overall", "PASS"]


@pytest.mark.slow
def test_gpu_tests_that_all_skip_do_not_pass() -> None:
    """Read through pytest's own report: here (no CUDA) every GPU test skips, which must not pass."""
    if torch.cuda.is_available():
        pytest.skip("checks the machine without CUDA")
    row = gpu_check.gpu_tests()
    assert not row.ok and row.detail.startswith("0 passed, 0 failed, ") and not row.detail.endswith(" 0 skipped")


@no_cuda
def test_bench_train_on_cuda_refuses_a_machine_without_gpus() -> None:
    result = CliRunner().invoke(app, ["bench", "train", "--device", "cuda", "--nproc", "1"])
    assert_one_line_error(result, r"--device cuda --nproc 1: this machine has 0 CUDA device\(s\); one rank per GPU")
    result = CliRunner().invoke(app, ["bench", "train", "--device", "tpu"])
    assert_one_line_error(result, r"--device 'tpu' is not one of cpu, cuda")
