"""The GPU check (scripts/gpu_check.sh, `make gpu-check`): without CUDA it says so in one line and
exits 3; its summary ends in one verdict; `bench train --device cuda` refuses a machine without
GPUs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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
def test_script_without_cuda_prints_one_line_and_exits_3(tmp_path: Path) -> None:
    """In one start of Python: before, the script imported torch twice (once to see that it
    imports, once for CUDA), seconds each."""
    starts, python = tmp_path / "starts", tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho start >> {starts}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    result = subprocess.run(
        [str(ROOT / "scripts" / "gpu_check.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": str(python)},
    )
    assert result.returncode == gpu_check.NO_CUDA == 3, result.stderr
    assert result.stdout.splitlines() == [result.stdout.strip()] and result.stdout.startswith(
        NO_CUDA_LINE
    )
    assert result.stderr == ""
    assert starts.read_text() == "start\n"


def test_script_without_torch_says_so_and_exits_5(tmp_path: Path) -> None:
    """A Python that cannot import torch (no `make setup` yet) is told as such, not 'no CUDA'."""
    bare = tmp_path / "python"
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -S -I "$@"\n')  # no site-packages
    bare.chmod(0o755)
    result = subprocess.run(
        [str(ROOT / "scripts" / "gpu_check.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHON": str(bare)},
    )
    assert result.returncode == 5, result.stdout + result.stderr
    assert result.stdout == (
        f"gpu check: {bare} cannot import torch: run make setup first (or name carried wheels in "
        "GPU_CHECK_WHEELS); nothing was run\n"
    )


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


# What the plugin (tools/bench/gpu_report.py) writes for `pytest -m gpu` on a machine with one GPU.
ONE_GPU_EVENTS = [
    {
        "event": "collected",
        "tests": [
            "tests/e2e/test_train_gpu.py::test_kill_and_resume_on_a_gpu_is_bitwise",
            "tests/e2e/test_train_gpu.py::test_two_ranks_train_over_nccl_and_eval_reshards",
            "tests/distributed/test_sharding_types.py::"
            "test_every_sharding_type_equals_unsharded_over_nccl_on_two_gpus",
            "tests/e2e/test_train_gpu.py::test_bf16_trains_on_a_gpu_near_fp32",
            "tests/unit/test_loader.py::test_cuda_batches_are_pinned",
        ],
    },
    *[
        {"event": "result", "test": t, "outcome": o, "message": m, "seconds": s}
        for t, o, m, s in [
            ("tests/e2e/test_train_gpu.py::test_kill_and_resume_on_a_gpu_is_bitwise", "passed", "", 31.2),
            ("tests/e2e/test_train_gpu.py::test_two_ranks_train_over_nccl_and_eval_reshards", "skipped",
             "needs 2 GPUs", 0.0),
            ("tests/distributed/test_sharding_types.py::"
             "test_every_sharding_type_equals_unsharded_over_nccl_on_two_gpus", "skipped", "needs 2 GPUs", 0.0),
            ("tests/e2e/test_train_gpu.py::test_bf16_trains_on_a_gpu_near_fp32", "failed",
             "AssertionError: assert 0.61 == 0.70 ± 2.0e-02", 12.5),
            ("tests/unit/test_loader.py::test_cuda_batches_are_pinned", "skipped", "needs CUDA", 0.1),
        ]
    ],
]  # fmt: skip


def _fake_pytest(events: list[dict], code: int | None = 1, stopped: str = ""):
    """A runner that answers `pytest -m gpu` with the plugin's `events`, without running it."""

    def run(cmd, env, report: Path, budget) -> gpu_check.Outcome:
        assert "shardrec.tools.bench.gpu_report" in cmd and env["GPU_CHECK_REPORT"] == str(report)
        report.write_text("".join(json.dumps(e) + "\n" for e in events))
        return gpu_check.Outcome(code, "", 44.0, stopped)

    return run


def test_a_check_one_gpu_cannot_run_is_not_run_never_passed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows, _, _ = gpu_check.gpu_tests(_fake_pytest(ONE_GPU_EVENTS), times={})
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


def test_a_check_stopped_at_its_budget_keeps_every_result_before_it() -> None:
    """The table after a timeout: what finished, the test cut short and those never reached."""
    tests = [f"tests/t.py::test_{i}" for i in range(3)]
    events = [
        {"event": "collected", "tests": tests},
        {"event": "start", "test": tests[0]},
        {"event": "result", "test": tests[0], "outcome": "passed", "message": "", "seconds": 40.0},
        {"event": "start", "test": tests[1]},
    ]
    why = "the time budget ran out (420 s)"
    rows, _, stopped = gpu_check.gpu_tests(_fake_pytest(events, None, why), times={})
    assert stopped == why
    assert [(r.check, r.status, r.detail) for r in rows] == [
        ("test_0", "pass", ""),
        ("test_1", "fail", f"stopped while it ran: {why}"),
        ("test_2", "fail", f"not reached: {why}"),
    ]
    assert gpu_check.verdict(rows) == "FAIL"


def test_no_collection_is_a_failure() -> None:
    (row,) = gpu_check.gpu_tests(_fake_pytest([], code=4), times={})[0]
    assert (row.status, row.detail) == ("fail", "exit 4: no GPU test collected")
    (row,) = gpu_check.gpu_tests(_fake_pytest([{"event": "collected", "tests": []}], 5), times={})[
        0
    ]
    assert row.detail == "exit 5: no GPU test collected"


def test_the_budget_is_the_tests_measured_times_with_headroom(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GPU_CHECK_TEST_S", raising=False)
    times = {"a": 10.0, "b": 20.0}
    assert gpu_check.budget_s(["a", "b", "c"], times) == (
        gpu_check.HEADROOM * (10 + 20 + gpu_check.UNKNOWN_TEST_S) + gpu_check.STARTUP_S
    )
    monkeypatch.setenv("GPU_CHECK_TEST_S", "99")
    assert gpu_check.budget_s(["a"], times) == 99.0
    # A run that ended by itself writes what it measured, naming the device, for the next budget.
    path = tmp_path / "times.json"
    path.write_text(
        json.dumps({"about": "x", "tests": {"a": {"seconds": 10, "measured_on": "estimate"}}})
    )
    events = [
        {"event": "result", "test": "a", "outcome": "passed", "seconds": 12.34},
        {"event": "result", "test": "s", "outcome": "skipped", "seconds": 0.0},
    ]
    gpu_check.record_times(events, "1 x NVIDIA H200", path)
    assert json.loads(path.read_text())["tests"] == {
        "a": {"seconds": 12.3, "measured_on": "1 x NVIDIA H200"}
    }
    assert gpu_check.read_times(path) == {"a": 12.3}


_TESTS = """
import time, pytest
def test_passes(): pass
def test_fails(): assert 1 == 2, "one is not two"
@pytest.mark.skip(reason="needs 2 GPUs")
def test_skips(): pass
def test_hangs(): time.sleep(60)
def test_never_reached(): pass
"""


def test_each_result_is_written_as_its_test_ends_and_survives_the_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real plugin under a real pytest, ended by the check at a 2-second budget."""
    (tmp_path / "test_cases.py").write_text(_TESTS)
    report = tmp_path / "report.jsonl"
    monkeypatch.setattr(gpu_check, "STARTUP_S", 3.0)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p"]
    cmd += ["shardrec.tools.bench.gpu_report", str(tmp_path), "--rootdir", str(tmp_path)]
    env = {**os.environ, "GPU_CHECK_REPORT": str(report)}
    outcome = gpu_check._run_watched(cmd, env, report, lambda tests: 2.0)
    assert outcome.code is None and outcome.stopped == "the time budget ran out (5 s)"
    rows = gpu_check.rows_from_events(gpu_check.read_report(report), outcome.stopped)
    assert [(r.check, r.status, r.detail) for r in rows] == [
        ("test_passes", "pass", ""),
        ("test_fails", "fail", "AssertionError: one is not two"),
        ("test_skips", "not run", "not run: needs 2 GPUs"),
        ("test_hangs", "fail", "stopped while it ran: the time budget ran out (5 s)"),
        ("test_never_reached", "fail", "not reached: the time budget ran out (5 s)"),
    ]
    assert outcome.seconds < 20


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


def _files_marking_gpu_tests() -> list[str]:
    """The test files whose text marks a test `gpu` (pytest.mark.gpu), relative to the root."""
    tests = sorted((ROOT / "tests").rglob("test_*.py"))
    return [str(p.relative_to(ROOT)) for p in tests if "mark.gpu" in p.read_text()]


def _over_gpu_test_files(cmd, env, report, budget) -> gpu_check.Outcome:
    """The check's own pytest run, over the files that mark GPU tests instead of all of tests/:
    the same tests are collected, without importing every other test module (~30 s here)."""
    assert cmd[-1] == "tests", cmd
    return gpu_check._run_watched([*cmd[:-1], *_files_marking_gpu_tests()], env, report, budget)


@pytest.mark.slow
def test_gpu_tests_that_all_skip_do_not_pass() -> None:
    """Read through the real plugin: here (no CUDA) every GPU test skips, which must not pass; and
    every GPU test has a time in the budget's file."""
    if torch.cuda.is_available():
        pytest.skip("checks the machine without CUDA")
    rows, events, stopped = gpu_check.gpu_tests(_over_gpu_test_files)
    assert not stopped
    assert rows and all(r.status == "fail" and r.detail == "skipped: needs CUDA" for r in rows)
    collected = next(e["tests"] for e in events if e["event"] == "collected")
    assert sorted(collected) == sorted(gpu_check.read_times())


@no_cuda
def test_bench_train_on_cuda_refuses_a_machine_without_gpus() -> None:
    result = CliRunner().invoke(app, ["bench", "train", "--device", "cuda", "--nproc", "1"])
    assert_one_line_error(
        result, r"--device cuda --nproc 1: this machine has 0 CUDA device\(s\); one rank per GPU"
    )
    result = CliRunner().invoke(app, ["bench", "train", "--device", "tpu"])
    assert_one_line_error(result, r"--device 'tpu' is not one of cpu, cuda")
