"""Which index gives the CPU build of the pinned torch: the configured ones, or PyTorch's own.

`make setup` asks this before installing requirements/cpu.txt. On PyPI, `torch==X` on Linux is
the CUDA build (gigabytes of NVIDIA libraries); a machine whose configured indexes serve a CPU
build (a `+cpu` wheel, or one without NVIDIA dependencies, as on macOS) keeps them. Only pip's
resolver is asked (`pip install --dry-run --report`): nothing is downloaded past metadata and
nothing is installed.

Usage: python requirements/torch_index.py requirements/cpu.txt   -> prints the pip arguments
       (none, or the PyTorch CPU index) for `pip install $(...) -r requirements/cpu.txt`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# PyTorch's CPU index serves torch itself; everything else still comes from the configured indexes.
CPU_INDEX_ARGS = ["--extra-index-url", PYTORCH_CPU_INDEX]


def torch_pin(requirements: Path) -> str:
    """The `torch==...` line of a requirements file."""
    for line in requirements.read_text().splitlines():
        if re.match(r"^torch\s*==", line.strip()):
            return line.strip().replace(" ", "")
    raise SystemExit(f"{requirements}: no torch==VERSION line")


def resolve(requirement: str, extra: list[str]) -> dict | None:
    """pip's choice for `requirement` (its report entry), or None when pip cannot resolve it."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--no-deps",
        "--quiet",
        "--report",
        "-",
        *extra,
        requirement,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return None
    report = json.loads(done.stdout)
    return next(
        (item for item in report["install"] if item["metadata"]["name"].lower() == "torch"), None
    )


def is_cpu_build(item: dict) -> bool:
    """A torch wheel built without CUDA: a `+cpu` local version, or no NVIDIA runtime
    dependencies."""
    meta = item["metadata"]
    if meta["version"].endswith("+cpu"):
        return True
    return not any(dep.lower().startswith("nvidia-") for dep in meta.get("requires_dist") or [])


def index_args(requirement: str) -> list[str]:
    """Extra pip arguments that make `requirement` resolve to a CPU build, where one is needed."""
    item = resolve(requirement, [])
    if item is None or is_cpu_build(item):
        # Unresolvable here: the real install reports pip's own error.
        return []
    # A CUDA build: prefer PyTorch's CPU wheel, whose version is X+cpu and so wins over X.
    return CPU_INDEX_ARGS


if __name__ == "__main__":
    print(" ".join(index_args(torch_pin(Path(sys.argv[1])))))
