"""`python -m shardrec.tools.bench.gpu_check`: validate the CUDA path in one call.

On a machine with CUDA and the pinned stack (or the one other triple SHARDREC_ALLOW_STACK names:
the summary then says which ran), it runs the GPU-marked tests (`pytest -m gpu`), then a short
`shardrec bench train --device cuda` (ours fp32 and bf16 against stock torchrec fp32, on 2 GPUs
where there are 2, else 1), and prints one summary table last: one row per GPU test and per
bench variant. A test that needs more GPUs than the machine has is shown as "not run: needs N
GPUs", never as passed. scripts/gpu_check.sh (what `make gpu-check` runs) installs carried
wheels first on a machine without the stack; this module assumes shardrec imports.

Exit codes: 0 every check that could run passed; 1 a check failed; 3 no CUDA device was found
(one line, nothing run); 5 the installed stack is neither the pinned one nor the one
SHARDREC_ALLOW_STACK names (one line, nothing run). Each step has a time limit
(GPU_CHECK_TEST_S, GPU_CHECK_BENCH_S seconds) so that the whole check, installing included,
stays under 8 minutes and a failed first try can be rerun on a lent machine.
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
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

NO_CUDA = 3
OTHER_STACK = 5
TEST_LIMIT_S = int(os.environ.get("GPU_CHECK_TEST_S", "270"))
BENCH_LIMIT_S = int(os.environ.get("GPU_CHECK_BENCH_S", "150"))
NEEDS_GPUS = re.compile(r"needs (\d+) GPUs")
"""The skip reason of a GPU test that this machine has too few GPUs for
(tests/e2e/test_train_gpu.py)."""
Runner = Callable[[list[str], int], tuple[int | None, str, str, float]]
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Row:
    check: str
    status: str
    """pass, fail or "not run" (the machine lacks what the check needs: it did not pass)."""
    detail: str
    seconds: float


def cuda_devices() -> int:
    """CUDA devices torch sees (0 without a CUDA build, a driver or a device)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _run(cmd: list[str], limit_s: int) -> tuple[int | None, str, str, float]:
    """(exit code, or None past `limit_s`; stdout; stderr's tail; seconds). The command runs in a
    session of its own, so that past its limit torchrun's ranks die with it."""
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
    return code, out, err[-3000:], time.perf_counter() - start


def rows_from_report(suite: ElementTree.Element) -> list[Row]:
    """One row per test case of pytest's junit report: a failure or an error fails, a skip for
    too few GPUs is "not run", any other skip fails (on CUDA nothing else should skip)."""
    rows = []
    for case in suite.iter("testcase"):
        name, seconds = case.get("name", "?"), float(case.get("time", 0))
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        if problem is not None:
            lines = (problem.get("message") or "failed").strip().splitlines() or ["failed"]
            rows.append(Row(name, "fail", lines[0][:160], seconds))
        elif skipped is not None:
            reason = (skipped.get("message") or "").strip()
            needs = NEEDS_GPUS.search(reason)
            if needs:
                rows.append(Row(name, "not run", f"not run: needs {needs.group(1)} GPUs", seconds))
            else:
                rows.append(Row(name, "fail", f"skipped: {reason}", seconds))
        else:
            rows.append(Row(name, "pass", "", seconds))
    return rows


def gpu_tests(run: Runner = _run) -> list[Row]:
    """The GPU-marked tests, one row each (or one failed row when pytest gave no report)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "gpu.xml"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "gpu",
            f"--junitxml={report}",
            "tests",
        ]
        code, out, err, seconds = run(cmd, TEST_LIMIT_S)
        tail = (out + err)[-3000:]
        if code is None:
            return [Row("pytest -m gpu", "fail", f"timed out after {TEST_LIMIT_S} s", seconds)]
        if not report.exists():
            last = (tail.strip().splitlines() or [""])[-1]
            return [Row("pytest -m gpu", "fail", f"exit {code}, no report: {last}", seconds)]
        rows = rows_from_report(ElementTree.parse(report).getroot())
    if not rows:
        return [Row("pytest -m gpu", "fail", f"exit {code}: no GPU test ran", seconds)]
    if any(r.status == "fail" for r in rows):
        sys.stderr.write(tail + "\n")  # the failures' summary, above the table
    return rows


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
        "pass" if auc["ours_fp32"] > 0.5 else "fail",
        f"{rates['ours_fp32']:,.0f} samples/s, {result['ours_fp32_vs_stock_fp32']:.3f}x stock fp32 "
        f"({rates['stock_fp32']:,.0f}/s), AUC {auc['ours_fp32']:.4f} (stock {auc['stock_fp32']:.4f})",
        seconds,
    )
    bf16 = Row(
        f"{name} bf16",
        "pass" if result["bf16_auc_within_tolerance"] else "fail",
        f"{rates['ours_bf16']:,.0f} samples/s, {result['ours_bf16_vs_stock_fp32']:.3f}x stock fp32, "
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
    rows = gpu_tests()
    bench_rows, _ = bench_train(gpus)
    rows += bench_rows
    print(summary_table(rows, device))
    return 0 if verdict(rows) != "FAIL" else 1


def _allow_hint() -> str:
    from shardrec.trainer.job.versions import ALLOW_ENV, GPU_CHECK_STACK

    return f"{ALLOW_ENV}={'/'.join(GPU_CHECK_STACK)} make gpu-check"


if __name__ == "__main__":
    sys.exit(main())
