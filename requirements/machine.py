"""Which build of the pinned stack this machine needs, for `make setup` (standard library only).

The device kind is one of
- `cpu`: no GPU that nvidia-smi lists (or a driver too old for any CUDA build of the pinned torch);
- `cuda`: a driver of 580 or newer, which torch's CUDA 13 builds (PyPI's) need:
  requirements/cuda.txt;
- `cuda126`: an older driver (525 or newer): PyTorch's CUDA 12.6 builds, requirements/cuda126.txt.

`make setup` keeps one stamp per kind, so a `.venv` made on a CPU node (a shared home directory)
is rebuilt on a GPU node and back. A build of another kind is uninstalled first: `torch==2.13.0`
is satisfied by `2.13.0+cpu`, and fbgemm-gpu must never land on top of fbgemm-gpu-cpu (both
install the `fbgemm_gpu` package into the same folder).

A node whose Python already holds a CUDA build of a supported torch release (SUPPORTED: the
triples the test suite runs on, on their CPU builds) keeps it: `.venv` sees it through
--system-site-packages and only that release's fbgemm-gpu and torchrec are installed. Its kind is
the build's CUDA (PyPI's and `+cu130` builds: cuda; `+cu126`: cuda126). Any other torch there is
left alone and the pinned one installed into `.venv`, with one line saying so.

Usage (KIND as above):
  python requirements/machine.py kind          -> this machine's kind
  python requirements/machine.py system-torch  -> the kind of this Python's own CUDA torch where
                                                  .venv should use it, else nothing
  python requirements/machine.py stale KIND    -> installed packages of another kind's build (uninstall them first)
  python requirements/machine.py install-args KIND [system] [offline]
                                               -> pip arguments for KIND's stack (system: without
                                                  torch; offline: no index is asked)
  python requirements/machine.py check KIND    -> exit 1 with one line unless KIND's build is installed
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import torch_index

KINDS = ("cpu", "cuda", "cuda126")
CUDA13_DRIVER = 580
"""The oldest driver (major version) that runs CUDA 13 builds."""
CUDA12_DRIVER = 525
"""The oldest driver that runs CUDA 12.x builds (minor-version compatibility)."""
FBGEMM = {"cpu": "fbgemm-gpu-cpu", "cuda": "fbgemm-gpu", "cuda126": "fbgemm-gpu"}
REQUIREMENTS = Path(__file__).resolve().parent
SUPPORTED: dict[str, tuple[str, str]] = {"2.13.0": ("1.8.0", "1.8.0")}
"""torch release -> (fbgemm-gpu, torchrec) releases: the triples shardrec supports, each tested by
`make test` on its CPU build (trainer/job/versions.py's KNOWN_GOOD holds the same)."""
SYSTEM_TORCH_LABELS = {"": "cuda", "+cu130": "cuda", "+cu126": "cuda126"}
"""A CUDA torch's local version label -> the kind whose fbgemm-gpu build matches its CUDA."""


def driver_version() -> str | None:
    """The NVIDIA driver version nvidia-smi reports for the first GPU it lists (None: no GPU, no
    nvidia-smi, or nvidia-smi failing without a loaded driver)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (
        [line.strip() for line in done.stdout.splitlines() if line.strip()]
        if done.returncode == 0
        else []
    )
    return lines[0] if lines else None


def kind_for_driver(driver: str | None) -> str:
    if driver is None:
        return "cpu"
    major = int(driver.split(".")[0]) if driver.split(".")[0].isdigit() else 0
    if major >= CUDA13_DRIVER:
        return "cuda"
    if major >= CUDA12_DRIVER:
        return "cuda126"
    print(
        f"make setup: NVIDIA driver {driver} is older than any CUDA build of the pinned torch runs on "
        f"({CUDA12_DRIVER} for CUDA 12.6, {CUDA13_DRIVER} for CUDA 13): installing the CPU build",
        file=sys.stderr,
    )
    return "cpu"


def torch_kind(version: str, requires: list[str]) -> str:
    """The kind of an installed torch build, from its version's local label and its dependencies."""
    item = {"metadata": {"version": version, "requires_dist": requires}}
    if torch_index.is_cpu_build(item):
        return "cpu"
    return "cuda126" if version.endswith("+cu126") else "cuda"


def stale_packages(kind: str, installed: dict[str, tuple[str, list[str]]]) -> list[str]:
    """What to uninstall before installing `kind`'s build; `installed`: name -> (version,
    requires)."""
    stale = []
    if "torch" in installed and torch_kind(*installed["torch"]) != kind:
        stale.append("torch")
    for name in ("fbgemm-gpu", "fbgemm-gpu-cpu"):
        if name not in installed:
            continue
        other_cuda = name == "fbgemm-gpu" and installed[name][0].endswith("+cu126") != (
            kind == "cuda126"
        )
        if name != FBGEMM[kind] or other_cuda:
            stale.append(name)
    return stale


def installed_stack() -> dict[str, tuple[str, list[str]]]:
    """torch and fbgemm-gpu(-cpu) as installed in the running Python: name -> (version,
    requires)."""
    found = {}
    for name in ("torch", "fbgemm-gpu", "fbgemm-gpu-cpu"):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found[name] = (dist.version, list(dist.requires or []))
    return found


def system_torch_kind(version: str | None, requires: list[str]) -> tuple[str, str]:
    """(kind, "") where this Python's torch `version` is a CUDA build of a supported release that
    .venv can use, else ("", why not: one line, or "" where there is no torch)."""
    if version is None:
        return "", ""
    release, _, label = version.partition("+")
    label = f"+{label}" if label else ""
    if not label.startswith("+cu") and torch_kind(version, requires) == "cpu":
        return "", ""  # a CPU build: .venv gets the kind the driver asks for
    if release not in SUPPORTED or label not in SYSTEM_TORCH_LABELS:
        known = ", ".join(
            f"torch {t} + fbgemm-gpu {f} + torchrec {r}" for t, (f, r) in SUPPORTED.items()
        )
        return "", (
            f"make setup: this Python's torch {version} is no CUDA build of a supported triple "
            f"({known}; CUDA 13 or 12.6 builds): installing the pinned torch into .venv"
        )
    return SYSTEM_TORCH_LABELS[label], ""


def install_args(kind: str, system: bool = False, offline: bool = False) -> list[str]:
    """pip's arguments for `kind`'s stack: requirements/KIND.txt, with PyTorch's CPU index where the
    configured indexes give a CUDA torch (not offline); for a system torch, its pins but torch's."""
    path = REQUIREMENTS / f"{kind}.txt"
    extra = [] if offline else index_args(kind)
    if not system:
        return [*extra, "-r", str(path.relative_to(REQUIREMENTS.parent))]
    args = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.replace(" ", "").startswith("torch=="):
            continue
        args += line.split()
    return [*extra, *args]


def index_args(kind: str) -> list[str]:
    """Extra pip arguments for requirements/KIND.txt: PyTorch's CPU index where the configured
    indexes give a CUDA torch (torch_index); the CUDA files name their own index."""
    if kind == "cpu":
        return torch_index.index_args(torch_index.torch_pin(REQUIREMENTS / "cpu.txt"))
    return []


def check(kind: str) -> str:
    """ "" when `kind`'s build is what is installed, else one line saying what is."""
    stale = stale_packages(kind, installed_stack())
    if not stale:
        return ""
    versions = ", ".join(f"{name} {installed_stack()[name][0]}" for name in stale)
    return (
        f"make setup: .venv holds {versions}, not the {kind} build this machine needs; the package index "
        f"pip used served another build (see requirements/{kind}.txt and pip's configuration)"
    )


def main(argv: list[str]) -> int:
    command, kind = (argv + [""])[:2]
    if command == "kind":
        print(kind_for_driver(driver_version()))
        return 0
    if command == "system-torch":
        torch = installed_stack().get("torch", (None, []))
        found, why = system_torch_kind(*torch)
        if why:
            print(why, file=sys.stderr)
        print(found)
        return 0
    commands = ("stale", "index", "install-args", "check")
    if kind not in KINDS or command not in commands:
        print(
            "usage: machine.py kind | system-torch | stale KIND | index KIND | "
            f"install-args KIND [system] [offline] | check KIND (KIND: {', '.join(KINDS)})",
            file=sys.stderr,
        )
        return 2
    if command == "stale":
        print(" ".join(stale_packages(kind, installed_stack())))
    elif command == "index":
        print(" ".join(index_args(kind)))
    elif command == "install-args":
        print(" ".join(install_args(kind, "system" in argv[2:], "offline" in argv[2:])))
    else:
        problem = check(kind)
        if problem:
            print(problem, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
