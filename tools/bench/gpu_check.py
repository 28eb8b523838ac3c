"""`python -m shardrec.tools.bench.gpu_check`: validate the CUDA path in one call.

On a machine with CUDA it runs the GPU-marked tests (`pytest -m gpu`), then a short
`shardrec bench train --device cuda` (ours fp32 and bf16 against stock torchrec fp32, on 2 GPUs
where there are 2, else 1), and prints one summary table last. scripts/gpu_check.sh (what
`make gpu-check` runs) installs carried wheels first on a machine without the stack; this module
assumes shardrec imports.

Exit codes: 0 every check passed; 1 a check failed; 3 no CUDA device was found (one line, nothing
run). Each step has a time limit (GPU_CHECK_TEST_S, GPU_CHECK_BENCH_S seconds) so that the whole
check stays under 8 minutes and a failed first try can be rerun on a lent machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

NO_CUDA = 3
TEST_LIMIT_S = int(os.environ.get("GPU_CHECK_TEST_S", "200"))
BENCH_LIMIT_S = int(os.environ.get("GPU_CHECK_BENCH_S", "220"))
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Row:
    check: str
    ok: bool
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
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=limit_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        code = None
    return code, out, err[-3000:], time.perf_counter() - start


def gpu_tests() -> Row:
    """The GPU-marked tests; a skip counts against the check (on CUDA nothing should skip)."""
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
        code, out, err, seconds = _run(cmd, TEST_LIMIT_S)
        tail = (out + err)[-3000:]
        if code is None:
            return Row("pytest -m gpu", False, f"timed out after {TEST_LIMIT_S} s", seconds)
        if not report.exists():
            last = (tail.strip().splitlines() or [""])[-1]
            return Row("pytest -m gpu", False, f"exit {code}, no report: {last}", seconds)
        suite = ElementTree.parse(report).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}  # type: ignore[union-attr]
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    ok = code == 0 and passed > 0 and counts["skipped"] == 0
    detail = f"{passed} passed, {counts['failures'] + counts['errors']} failed, {counts['skipped']} skipped"
    if not ok and code != 0:
        sys.stderr.write(tail + "\n")  # the failures' summary, above the table
    return Row("pytest -m gpu", ok, detail, seconds)


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
        "3",
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
        return [Row(name, False, why, seconds)], None
    try:
        result = json.loads(out[out.index("{") :])
    except ValueError:
        return [Row(name, False, "no JSON result on stdout", seconds)], None
    rates, auc = result["median_samples_per_s"], result["val_auc"]
    fp32 = Row(
        f"{name} fp32",
        auc["ours_fp32"] > 0.5,
        f"{rates['ours_fp32']:,.0f} samples/s, {result['ours_fp32_vs_stock_fp32']:.3f}x stock fp32 "
        f"({rates['stock_fp32']:,.0f}/s), AUC {auc['ours_fp32']:.4f} (stock {auc['stock_fp32']:.4f})",
        seconds,
    )
    bf16 = Row(
        f"{name} bf16",
        bool(result["bf16_auc_within_tolerance"]),
        f"{rates['ours_bf16']:,.0f} samples/s, {result['ours_bf16_vs_stock_fp32']:.3f}x stock fp32, "
        f"AUC {auc['ours_bf16']:.4f} ({'within' if result['bf16_auc_within_tolerance'] else 'NOT within'} 0.002)",
        0.0,
    )
    return [fp32, bf16], result


def summary_table(rows: list[Row], device: str) -> str:
    width = max(len(r.check) for r in rows)
    lines = [f"GPU check on {device}", f"{'check':<{width}}  result  {'s':>6}  detail"]
    lines += [f"{r.check:<{width}}  {'PASS' if r.ok else 'FAIL':<6}  {r.seconds:>6.0f}  {r.detail}" for r in rows]
    verdict = "PASS" if all(r.ok for r in rows) else "FAIL"
    lines.append(f"{'overall':<{width}}  {verdict}")
    return "\n".join(lines)


def main() -> int:
    gpus = cuda_devices()
    if gpus == 0:
        print("gpu check: no CUDA device was found (torch.cuda.is_available() is False); nothing was run")
        return NO_CUDA
    import torch

    device = f"{gpus} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    rows = [gpu_tests()]
    bench_rows, _ = bench_train(gpus)
    rows += bench_rows
    print(summary_table(rows, device))
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
