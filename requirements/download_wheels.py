"""Download every wheel `make setup WHEELS=DIR` installs, for a node without network (standard
library only; run it on a machine that reaches the package indexes).

For a device kind (cpu, cuda, cuda126: requirements/machine.py) it fetches, into DIR, in one
resolve: the kind's torch and fbgemm-gpu (requirements/KIND.txt, PyTorch's CPU index for the cpu
kind, whose torch PyPI serves as a CUDA build), torchrec's real dependencies, shardrec's own
dependencies with its test extra (pyproject.toml), the build backend of its editable install
(pyproject's build-system) and pip; then torchrec itself without its dependencies (its wheel names
the CUDA fbgemm-gpu). --python-version and --platform fetch wheels for a node of another Python or
platform (pip then takes binary wheels only).

Usage:
  python requirements/download_wheels.py KIND DIR [--python-version 3.12]
      [--platform manylinux_2_28_x86_64] [-- EXTRA PIP ARGUMENTS]
then, on the node: make setup WHEELS=DIR   (or SHARDREC_WHEELS=DIR make setup)
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
from pathlib import Path

import machine

ROOT = Path(__file__).resolve().parents[1]
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
"""What `--platform linux` stands for: the manylinux tags torch's and fbgemm's wheels carry."""


def project_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """shardrec's dependencies, its test extra and its build backend, as pip requirements."""
    project = tomllib.loads(pyproject.read_text())
    return [
        *project["project"]["dependencies"],
        *project["project"]["optional-dependencies"]["test"],
        *project["build-system"]["requires"],
        "pip",
    ]


def target_args(python_version: str | None, platforms: list[str]) -> list[str]:
    """pip download's arguments for another node's Python and platform (none: this one's)."""
    if not python_version and not platforms:
        return []
    args = ["--only-binary=:all:"]
    if python_version:
        args += ["--python-version", python_version]
    for platform in platforms:
        args += ["--platform", platform]
    return args


def commands(kind: str, out: Path, target: list[str], extra: list[str]) -> list[list[str]]:
    """The pip download commands, in order."""
    pip = [sys.executable, "-m", "pip", "download", "--dest", str(out), *target]
    # As `make setup` asks: PyTorch's CPU index where the indexes configured here serve the cpu
    # kind a CUDA torch (requirements/torch_index.py); none when the caller's arguments say so.
    index = [] if "--no-index" in extra else machine.index_args(kind)
    reqs = ROOT / "requirements"
    return [
        [
            *pip,
            *index,
            *extra,
            "-r",
            str(reqs / f"{kind}.txt"),
            "-r",
            str(reqs / "torchrec-deps.txt"),
            *project_requirements(),
        ],
        [*pip, "--no-deps", *extra, "-r", str(reqs / "torchrec.txt")],
    ]


def main(argv: list[str]) -> int:
    cut = argv.index("--") if "--" in argv else len(argv)
    ours, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=machine.KINDS)
    parser.add_argument("out", type=Path)
    parser.add_argument("--python-version", help="the node's Python, e.g. 3.12")
    parser.add_argument(
        "--platform",
        action="append",
        default=[],
        help="a wheel platform tag of the node (repeatable); 'linux' for manylinux x86_64",
    )
    args = parser.parse_args(ours)
    platforms = [p for given in args.platform for p in (PLATFORMS if given == "linux" else [given])]
    args.out.mkdir(parents=True, exist_ok=True)
    for cmd in commands(args.kind, args.out, target_args(args.python_version, platforms), extra):
        done = subprocess.run(cmd)
        if done.returncode != 0:
            print(
                f"download_wheels: pip download failed (exit {done.returncode}): {' '.join(cmd)}",
                file=sys.stderr,
            )
            return 1
    wheels = sorted(p.name for p in args.out.glob("*.whl"))
    print(
        f"{len(wheels)} wheels for the {args.kind} stack in {args.out}; on the node: "
        f"make setup WHEELS={args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
