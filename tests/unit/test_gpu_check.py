"""The GPU check (scripts/gpu_check.sh, `make gpu-check`): without CUDA it says so in one line and
exits 3; its summary ends in one verdict; `bench train --device cuda` refuses a machine without
GPUs."""

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
    result = subprocess.run(
        [str(ROOT / "scripts" / "gpu_check.sh")], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == gpu_check.NO_CUDA == 3, result.stderr
    assert result.stdout.splitlines() == [result.stdout.strip()] and result.stdout.startswith(
        NO_CUDA_LINE
    )
    assert result.stderr == ""


@no_cuda
def test_module_without_cuda_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main() == 3
    assert capsys.readouterr().out.startswith(NO_CUDA_LINE)


@no_cuda
@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_target_runs_the_script() -> None:
    result = subprocess.run(
        ["make", "-s", "gpu-check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0 and result.stdout.startswith(NO_CUDA_LINE)


def test_summary_ends_in_one_verdict() -> None:
    rows = [
        gpu_check.Row("test_kill_and_resume_on_a_gpu_is_bitwise", "pass", "", 41.0),
        gpu_check.Row("bench train cuda x2 bf16", "fail", "AUC 0.7000 (NOT within 0.002)", 0.0),
    ]
    lines = gpu_check.summary_table(rows, "2 x H200").splitlines()
    assert lines[0] == "GPU check on 2 x H200"
    assert lines[2].split()[:3] == ["test_kill_and_resume_on_a_gpu_is_bitwise", "PASS", "41"]
    assert "FAIL" in lines[3] and lines[-1].split() == ["overall", "FAIL"]
    assert gpu_check.summary_table(rows[:1], "x").splitlines()[-1].split() == ["overall", "PASS"]


# pytest's junit report of `pytest -m gpu` on a machine with one GPU.
ONE_GPU_REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.e2e.test_train_gpu" name="test_kill_and_resume_on_a_gpu_is_bitwise" time="31.2"/>
<testcase classname="tests.e2e.test_train_gpu" name="test_two_ranks_train_over_nccl_and_eval_reshards" time="0.0">
<skipped type="pytest.skip" message="needs 2 GPUs">tests/e2e/test_train_gpu.py:200: needs 2 GPUs</skipped></testcase>
<testcase classname="tests.distributed.test_sharding_types"
 name="test_every_sharding_type_equals_unsharded_over_nccl_on_two_gpus" time="0.0">
<skipped type="pytest.skip" message="needs 2 GPUs">needs 2 GPUs</skipped></testcase>
<testcase classname="tests.e2e.test_train_gpu" name="test_bf16_trains_on_a_gpu_near_fp32" time="12.5">
<failure message="AssertionError: assert 0.61 == 0.70 &#177; 2.0e-02&#10;more">trace</failure></testcase>
<testcase classname="tests.unit.test_loader" name="test_cuda_batches_are_pinned" time="0.1">
<skipped type="pytest.skip" message="needs CUDA">needs CUDA</skipped></testcase>
</testsuite></testsuites>"""


def _fake_pytest(report: str, code: int = 1):
    """A runner that answers `pytest -m gpu` with `report` as its junit file, without running it."""

    def run(cmd: list[str], limit_s: int) -> tuple[int | None, str, str, float]:
        path = next(arg.split("=", 1)[1] for arg in cmd if arg.startswith("--junitxml="))
        Path(path).write_text(report)
        return code, "", "", 44.0

    return run


def test_a_check_one_gpu_cannot_run_is_not_run_never_passed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = gpu_check.gpu_tests(_fake_pytest(ONE_GPU_REPORT))
    by_name = {r.check: r for r in rows}
    assert [r.status for r in rows] == ["pass", "not run", "not run", "fail", "fail"]
    nccl = by_name["test_two_ranks_train_over_nccl_and_eval_reshards"]
    assert nccl.detail == "not run: needs 2 GPUs"
    assert (
        by_name["test_bf16_trains_on_a_gpu_near_fp32"].detail
        == "AssertionError: assert 0.61 == 0.70 ± 2.0e-02"
    )
    assert (
        by_name["test_cuda_batches_are_pinned"].detail == "skipped: needs CUDA"
    )  # on CUDA, a real failure
    table = gpu_check.summary_table(rows, "1 x H200").splitlines()
    assert "NOT RUN" in table[3] and "not run: needs 2 GPUs" in table[3] and "PASS" not in table[3]
    assert table[-1].split() == ["overall", "FAIL"]
    passing = [r for r in rows if r.status != "fail"]
    assert gpu_check.verdict(passing) == "PASS (2 not run: needs 2 GPUs)"
    assert gpu_check.verdict([r for r in rows if r.status == "not run"]) == "FAIL"  # nothing passed


def test_no_report_or_no_test_is_a_failure() -> None:
    (row,) = gpu_check.gpu_tests(lambda cmd, limit_s: (4, "", "ERROR: usage", 1.0))
    assert (row.status, row.detail) == ("fail", "exit 4, no report: ERROR: usage")
    (row,) = gpu_check.gpu_tests(
        _fake_pytest('<testsuites><testsuite tests="0"/></testsuites>', code=5)
    )
    assert (row.status, row.detail) == ("fail", "exit 5: no GPU test ran")
    (row,) = gpu_check.gpu_tests(lambda cmd, limit_s: (None, "", "", 270.0))
    assert row.detail == f"timed out after {gpu_check.TEST_LIMIT_S} s"


def test_only_the_pinned_stack_runs_unless_another_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check runs on the pinned triple; another one only when the caller names it, and then the
    summary's first line says which ran."""
    from shardrec.trainer.job import versions

    monkeypatch.delenv(versions.ALLOW_ENV, raising=False)
    assert gpu_check.stack_description().endswith("(the pinned stack)")
    monkeypatch.setattr(versions, "found_stack", lambda: ("2.11.0+cu130", "1.6.0", "1.6.1"))
    monkeypatch.setattr(gpu_check, "cuda_devices", lambda: 1)
    with pytest.raises(ImportError, match="not a known-good combination"):
        gpu_check.stack_description()
    assert gpu_check.main() == gpu_check.OTHER_STACK == 5
    monkeypatch.setenv(versions.ALLOW_ENV, "2.11.0/1.6.0/1.6.1")
    assert gpu_check.stack_description() == (
        "torch 2.11.0+cu130, fbgemm-gpu 1.6.0, torchrec 1.6.1 "
        "(not the pinned stack: SHARDREC_ALLOW_STACK=2.11.0/1.6.0/1.6.1)"
    )


def test_the_script_admits_no_other_stack_by_itself() -> None:
    script = (ROOT / "scripts" / "gpu_check.sh").read_text()
    assert "SHARDREC_ALLOW_STACK=" not in script.replace("# SHARDREC_ALLOW_STACK", "")


@pytest.mark.slow
def test_gpu_tests_that_all_skip_do_not_pass() -> None:
    """Read through pytest's own report: here (no CUDA) every GPU test skips, which must not
    pass."""
    if torch.cuda.is_available():
        pytest.skip("checks the machine without CUDA")
    rows = gpu_check.gpu_tests()
    assert rows and all(r.status == "fail" and r.detail == "skipped: needs CUDA" for r in rows)


@no_cuda
def test_bench_train_on_cuda_refuses_a_machine_without_gpus() -> None:
    result = CliRunner().invoke(app, ["bench", "train", "--device", "cuda", "--nproc", "1"])
    assert_one_line_error(
        result, r"--device cuda --nproc 1: this machine has 0 CUDA device\(s\); one rank per GPU"
    )
    result = CliRunner().invoke(app, ["bench", "train", "--device", "tpu"])
    assert_one_line_error(result, r"--device 'tpu' is not one of cpu, cuda")
