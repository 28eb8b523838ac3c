"""`python -m shardrec.tools.bench.gpu_check`: validate the CUDA path in one call.

On a machine with CUDA and the pinned stack (or the one other triple SHARDREC_ALLOW_STACK names:
the summary then says which ran), it runs the GPU-marked tests (`pytest -m gpu`), then a short
`shardrec bench train --device cuda` (ours fp32 and bf16 against stock torchrec fp32, on 2 GPUs
where there are 2, else 1), and prints one summary table last: one row per GPU test and per
bench variant. A test that needs more GPUs than the machine has is shown as "not run: needs N
GPUs", never as passed. scripts/gpu_check.sh (what `make gpu-check` runs) installs carried
wheels first on a machine without the stack; this module assumes shardrec imports.

Each test's result is written as the test ends (tools/bench/gpu_report.py, a pytest plugin), so
the table has a row per test even when the check ends pytest at its time budget, or is itself
stopped (SIGTERM, SIGINT): a test cut short is a failure "stopped while it ran", one never reached
"not reached", neither a pass. The budget is HEADROOM times the seconds tests/gpu_check_times.json
gives the tests pytest collected (each measured by the last check that ran to its end, which
rewrites that file; estimates until then), plus the start-up; GPU_CHECK_TEST_S sets it instead.

Exit codes: 0 every check that could run passed; 1 a check failed; 3 no CUDA device was found
(one line, nothing run); 5 the installed stack is neither the pinned one nor the one
SHARDREC_ALLOW_STACK names (one line, nothing run).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardrec.tools.bench.rounds import ratio_text

NO_CUDA = 3
OTHER_STACK = 5
BENCH_LIMIT_S = int(os.environ.get("GPU_CHECK_BENCH_S", "150"))
HEADROOM = 1.5
"""The budget is this many times the tests' measured seconds: a slower or busier machine fits."""
STARTUP_S = 60.0
"""pytest's start and collection (torch's import), on top of the tests' own time."""
UNKNOWN_TEST_S = 30.0
"""The seconds a test without a measured time is budgeted."""
TIMES = Path(__file__).resolve().parents[2] / "tests" / "gpu_check_times.json"
NEEDS_GPUS = re.compile(r"needs (\d+) GPUs")
"""The skip reason of a GPU test that this machine has too few GPUs for
(tests/e2e/test_train_gpu.py)."""
ROOT = Path(__file__).resolve().parents[2]
FP32_MIN_AUC = 0.6
"""The bench's fp32 row passes only if ours learned, well above chance: its quality run (125
steps) reached val AUC 0.670 on 2 CPU ranks (stock torchrec 0.710)."""


class Stopped(Exception):
    """The check was asked to stop (SIGTERM, SIGINT): what ran so far is still reported."""


@dataclass
class Row:
    check: str
    status: str
    """pass, fail or "not run" (the machine lacks what the check needs: it did not pass)."""
    detail: str
    seconds: float


@dataclass
class Outcome:
    """How the pytest run ended."""

    code: int | None
    """pytest's exit code (None: the check ended it)."""
    tail: str
    """The end of its output."""
    seconds: float
    stopped: str = ""
    """Why the check ended it ("": it ended by itself)."""


Runner = Callable[[list[str], dict[str, str], Path, Callable[[list[str]], float]], Outcome]


def cuda_devices() -> int:
    """CUDA devices torch sees (0 without a CUDA build, a driver or a device)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def read_times(path: Path = TIMES) -> dict[str, float]:
    """Test node id -> its seconds (tests/gpu_check_times.json; {} where there is none)."""
    try:
        tests = json.loads(path.read_text())["tests"]
        return {name: float(entry["seconds"]) for name, entry in tests.items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def budget_s(tests: list[str], times: dict[str, float]) -> float:
    """The pytest run's limit: GPU_CHECK_TEST_S, else HEADROOM x the tests' seconds + start-up."""
    fixed = os.environ.get("GPU_CHECK_TEST_S")
    if fixed:
        return float(fixed)
    return HEADROOM * sum(times.get(t, UNKNOWN_TEST_S) for t in tests) + STARTUP_S


def read_report(path: Path) -> list[dict[str, Any]]:
    """The plugin's lines written so far (a torn last line, from a kill, is left out)."""
    try:
        text = path.read_text()
    except OSError:
        return []
    events = []
    for line in text.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def _collected(events: list[dict[str, Any]]) -> list[str] | None:
    return next((e["tests"] for e in events if e.get("event") == "collected"), None)


def _run_watched(
    cmd: list[str], env: dict[str, str], report: Path, budget: Callable[[list[str]], float]
) -> Outcome:
    """Run pytest in a session of its own (its ranks die with it), ended at its budget (known
    once it has collected its tests) or when this check is asked to stop."""
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        limit, stopped = STARTUP_S * 3, ""
        try:
            while proc.poll() is None:
                time.sleep(0.5)
                tests = _collected(read_report(report))
                if tests is not None:
                    limit = STARTUP_S + budget(tests)
                if time.monotonic() - start > limit:
                    stopped = f"the time budget ran out ({limit:.0f} s)"
                    break
        except Stopped as e:
            stopped = str(e)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.seek(0)
        tail = log.read()[-3000:]
    return Outcome(None if stopped else proc.returncode, tail, time.monotonic() - start, stopped)


def rows_from_events(events: list[dict[str, Any]], stopped: str = "") -> list[Row]:
    """One row per collected test: its result; a test the check cut short fails "stopped while
    it ran", one never reached fails "not reached" (neither passed). A skip for too few GPUs is
    "not run"; any other skip fails (on CUDA nothing else should skip)."""
    tests = _collected(events) or []
    results: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.get("event") == "result":
            worse = results.get(e["test"], {}).get("outcome") in ("failed", "error")
            if not worse:
                results[e["test"]] = e
    started = [e["test"] for e in events if e.get("event") == "start"]
    rows = []
    for test in tests:
        name, result = test.rsplit("::", 1)[-1], results.get(test)
        if result is None:
            why = stopped or "pytest ended before it"
            ran = test in started
            rows.append(
                Row(name, "fail", f"{'stopped while it ran' if ran else 'not reached'}: {why}", 0.0)
            )
            continue
        outcome, message, seconds = result["outcome"], result.get("message", ""), result["seconds"]
        if outcome == "passed":
            rows.append(Row(name, "pass", "", seconds))
        elif outcome == "skipped":
            needs = NEEDS_GPUS.search(message)
            if needs:
                rows.append(Row(name, "not run", f"not run: needs {needs.group(1)} GPUs", seconds))
            else:
                rows.append(Row(name, "fail", f"skipped: {message}", seconds))
        else:
            rows.append(Row(name, "fail", (message or outcome)[:160], seconds))
    return rows


def record_times(events: list[dict[str, Any]], device: str, path: Path = TIMES) -> None:
    """Write each test's measured seconds (tests that ran: passed or failed, not skipped) over its
    entry in `path`, naming the device; for the next check's budget."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {"tests": {}}
    for e in events:
        if e.get("event") == "result" and e["outcome"] in ("passed", "failed"):
            data["tests"][e["test"]] = {"seconds": round(e["seconds"], 1), "measured_on": device}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def gpu_tests(
    run: Runner = _run_watched, times: dict[str, float] | None = None
) -> tuple[list[Row], list[dict[str, Any]], str]:
    """The GPU-marked tests, one row each (or one failed row when pytest collected nothing); with
    the plugin's events and why the check stopped pytest ("": it did not)."""
    times = read_times() if times is None else times
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "gpu-report.jsonl"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        cmd += ["-p", "shardrec.tools.bench.gpu_report", "-m", "gpu", "tests"]
        env = {**os.environ, "GPU_CHECK_REPORT": str(report)}
        outcome = run(cmd, env, report, lambda tests: budget_s(tests, times) - STARTUP_S)
        events = read_report(report)
    rows = rows_from_events(events, outcome.stopped)
    if not rows:
        last = (outcome.tail.strip().splitlines() or [""])[-1]
        why = outcome.stopped or f"exit {outcome.code}"
        detail = f"{why}: no GPU test collected" + (f": {last}" if last else "")
        return [Row("pytest -m gpu", "fail", detail, outcome.seconds)], events, outcome.stopped
    if any(r.status == "fail" for r in rows):
        sys.stderr.write(outcome.tail + "\n")  # the failures' summary, above the table
    return rows, events, outcome.stopped


def _run(cmd: list[str], limit_s: int) -> tuple[int | None, str, str, float]:
    """(exit code, or None past `limit_s`; stdout; stderr's tail; seconds). The command runs in a
    session of its own, so that past its limit, or when the check is stopped, its ranks die with
    it."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=limit_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    except Stopped:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return code, out, err[-3000:], time.perf_counter() - start


def bench_train(gpus: int) -> tuple[list[Row], dict | None]:
    """A short `bench train --device cuda` of the reference model; rows for fp32 and bf16."""
    ranks = min(2, gpus)
    threads = max(1, min(8, (os.cpu_count() or 1) // ranks))
    cmd = [
        sys.executable,
        "-m",
        "shardrec.tools.cli",
        "bench",
        "train",
        "--device",
        "cuda",
        "--nproc",
        str(ranks),
        "--model",
        "reference",
        "--rounds",
        "2",
        "--steps",
        "32",
        "--quality-steps",
        "125",
        "--threads",
        str(threads),
        "--json",
    ]
    code, out, err, seconds = _run(cmd, BENCH_LIMIT_S)
    name = f"bench train cuda x{ranks}"
    if code != 0:
        why = f"timed out after {BENCH_LIMIT_S} s" if code is None else f"exit {code}"
        sys.stderr.write(err + "\n")
        return [Row(name, "fail", why, seconds)], None
    try:
        result = json.loads(out[out.index("{") :])
    except ValueError:
        return [Row(name, "fail", "no JSON result on stdout", seconds)], None
    rates, auc = result["median_samples_per_s"], result["val_auc"]
    fp32 = Row(
        f"{name} fp32",
        "pass" if auc["ours_fp32"] >= FP32_MIN_AUC else "fail",
        f"{rates['ours_fp32']:,.0f} samples/s, {ratio_text(result['ours_fp32_vs_stock_fp32'])} stock fp32 "
        f"({rates['stock_fp32']:,.0f}/s), AUC {auc['ours_fp32']:.4f} (stock {auc['stock_fp32']:.4f})",
        seconds,
    )
    bf16 = Row(
        f"{name} bf16",
        "pass" if result["bf16_auc_within_tolerance"] else "fail",
        f"{rates['ours_bf16']:,.0f} samples/s, {ratio_text(result['ours_bf16_vs_stock_fp32'])} stock fp32, "
        f"AUC {auc['ours_bf16']:.4f} ({'within' if result['bf16_auc_within_tolerance'] else 'NOT within'} 0.002)",
        0.0,
    )
    return [fp32, bf16], result


def verdict(rows: list[Row]) -> str:
    """FAIL when a check failed or none passed; else PASS, naming what did not run."""
    if not any(r.status == "pass" for r in rows) or any(r.status == "fail" for r in rows):
        return "FAIL"
    skipped = [r for r in rows if r.status == "not run"]
    return (
        f"PASS ({len(skipped)} not run: {', '.join(sorted({r.detail[9:] for r in skipped}))})"
        if skipped
        else "PASS"
    )


def summary_table(rows: list[Row], device: str) -> str:
    width = max(len(r.check) for r in rows)
    lines = [f"GPU check on {device}", f"{'check':<{width}}  {'result':<7}  {'s':>6}  detail"]
    lines += [
        f"{r.check:<{width}}  {r.status.upper():<7}  {r.seconds:>6.0f}  {r.detail}" for r in rows
    ]
    lines.append(f"{'overall':<{width}}  {verdict(rows)}")
    return "\n".join(lines)


def stack_description() -> str:
    """Which torch / fbgemm-gpu / torchrec ran, and whether it is the pinned triple (an ImportError
    naming the versions when it is neither that nor the one SHARDREC_ALLOW_STACK names)."""
    from shardrec.trainer.job import versions

    versions.check_stack()
    found = versions.found_stack()
    names = f"torch {found[0]}, fbgemm-gpu {found[1]}, torchrec {found[2]}"
    if versions.is_known_good(found):
        return f"{names} (the pinned stack)"
    return f"{names} (not the pinned stack: {versions.ALLOW_ENV}={os.environ.get(versions.ALLOW_ENV, '')})"


def _stop(signum: int, frame: Any) -> None:
    raise Stopped(f"the check was stopped ({signal.Signals(signum).name})")


def main() -> int:
    gpus = cuda_devices()
    if gpus == 0:
        print(
            "gpu check: no CUDA device was found (torch.cuda.is_available() is False); nothing was run"
        )
        return NO_CUDA
    try:
        stack = stack_description()
    except ImportError as e:
        print(f"gpu check: {e}; to check another triple, name it: {_allow_hint()}")
        return OTHER_STACK
    import torch

    device = f"{gpus} x {torch.cuda.get_device_name(0)}, {stack}"
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    rows: list[Row] = []
    try:
        tests, events, stopped = gpu_tests()
        rows += tests
        if not stopped and not os.environ.get("GPU_CHECK_TEST_S"):
            record_times(events, f"{gpus} x {torch.cuda.get_device_name(0)}")
        if stopped:
            rows.append(Row("bench train", "fail", f"not reached: {stopped}", 0.0))
        else:
            rows += bench_train(gpus)[0]
    except Stopped as e:
        rows.append(Row("bench train", "fail", f"stopped while it ran: {e}", 0.0))
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
    print(summary_table(rows, device))
    return 0 if verdict(rows) != "FAIL" else 1


def _allow_hint() -> str:
    from shardrec.trainer.job.versions import ALLOW_ENV, GPU_CHECK_STACK

    return f"{ALLOW_ENV}={'/'.join(GPU_CHECK_STACK)} make gpu-check"


if __name__ == "__main__":
    sys.exit(main())
