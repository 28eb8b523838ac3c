"""Which device kind a job runs on: `auto` is CUDA where torch can use it, and a GPU host where
torch cannot is told why in one line instead of training on the CPU without a word.

`nvidia-smi` is the witness of GPUs that torch does not see: a CPU build of torch (a `.venv`
made on a CPU node of a shared home directory), or a CUDA build newer than the driver (torch's
CUDA 13 builds need driver 580 or newer; PyTorch's CUDA 12.6 index serves the way out, which
`make setup` picks for such a driver). CUDA_VISIBLE_DEVICES set to hide every GPU is a choice,
not a fault: auto is then the CPU, silently.

torch is imported where a device is looked at: a job on "cpu", or on "auto" where the host has no
GPU device (`no_gpu_device`), is checked without it (`shardrec train` and `shardrec eval` check
their request before any heavy import and leave torch to their ranks).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

DEVICE_KINDS = ("auto", "cpu", "cuda")
MIN_DRIVER = {13: 580, 12: 525, 11: 450}
"""CUDA major version -> the oldest driver (major) that runs it (NVIDIA's minor-version
compatibility)."""
CPU_INSTEAD = 'or set train.device = "cpu" to train on the CPU'


def nvidia_driver_versions() -> list[str]:
    """The driver version nvidia-smi reports for each GPU it lists ([] without nvidia-smi, or when
    it fails: no driver loaded, no device)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        done = subprocess.run(
            [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def _major(version: str) -> int | None:
    head = version.split(".")[0]
    return int(head) if head.isdigit() else None


def _gpus_hidden() -> bool:
    """CUDA_VISIBLE_DEVICES set to show no GPU ("" or -1): the CPU is the user's choice."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible is not None and visible.strip() in ("", "-1")


def cuda_unusable_reason(instead: str = CPU_INSTEAD) -> str | None:
    """Why torch cannot use the GPUs nvidia-smi lists, in one line ending with `instead`, the way
    to the CPU (None: it can, or there are none)."""
    import torch

    if torch.cuda.is_available() or _gpus_hidden():
        return None
    drivers = nvidia_driver_versions()
    if not drivers:
        return None
    gpus, driver = f"{len(drivers)} NVIDIA GPU{'s' if len(drivers) > 1 else ''}", drivers[0]
    if torch.version.cuda is None:
        return (
            f"this machine has {gpus} (nvidia-smi) but torch {torch.__version__} is a CPU build: "
            f"run `make setup` on this machine (it installs the CUDA build), {instead}"
        )
    cuda_major = _major(torch.version.cuda)
    need = MIN_DRIVER.get(cuda_major) if cuda_major is not None else None
    have = _major(driver)
    if need is not None and have is not None and have < need:
        return (
            f"this machine has {gpus} but NVIDIA driver {driver} is too old for torch {torch.__version__} "
            f"(CUDA {torch.version.cuda} needs driver {need} or newer): run `make setup` (it installs the "
            f"CUDA 12.6 build for this driver) or update the driver, {instead}"
        )
    return (
        f"this machine has {gpus} (driver {driver}) but torch {torch.__version__} (CUDA {torch.version.cuda}) "
        f"cannot use them (torch.cuda.is_available() is False): check the driver and CUDA_VISIBLE_DEVICES, "
        f"{instead}"
    )


def resolve_device_kind(
    device: str, setting: str = "train.device = 'auto'", instead: str = CPU_INSTEAD
) -> str:
    """ "cpu" or "cuda" for a device setting of auto, cpu or cuda: auto is cuda where torch can use
    it; ValueError (one line) on a GPU host where it cannot, rather than the CPU without a word.

    setting: how the line names the setting that asked for auto (eval names its --device);
    instead: how the line ends, the way to the CPU."""
    if device not in DEVICE_KINDS:
        raise ValueError(f"device kind {device!r} is not one of {', '.join(DEVICE_KINDS)}")
    if device != "auto":
        return device
    if no_gpu_device():  # the CPU, without importing torch (seconds)
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    reason = cuda_unusable_reason(instead)
    if reason is not None:
        raise ValueError(f"{setting}: {reason}")
    return "cpu"


def check_ranks_fit(
    kind: str, ranks: int, asked: str | None = None, remedy: str = f", {CPU_INSTEAD}"
) -> None:
    """Every CUDA rank of this machine needs a GPU of its own: ValueError (one line) when `ranks`
    local ranks would outnumber them, before any rank starts (set_device would fail in N-1 ranks).

    asked: where the rank count came from, as the line starts (default "--nproc-per-node N");
    remedy: what follows "start at most G ranks here" (default: train on the CPU instead)."""
    if kind != "cuda":
        return
    import torch

    gpus = torch.cuda.device_count()
    if ranks > gpus:
        raise ValueError(
            f"{asked or f'--nproc-per-node {ranks}'}: this machine has {gpus} CUDA device{'s' if gpus != 1 else ''} "
            f"and each CUDA rank needs one of its own; start at most {gpus} rank{'s' if gpus != 1 else ''} here{remedy}"
        )


def usable_cores() -> int:
    """The cores this process may run on (its affinity: a job under `taskset` or in a cpuset gets
    its share, not the machine's, as dist.bind_to_cores splits them); os.cpu_count() where the
    platform does not say."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def rank_threads(ranks: int) -> int | None:
    """The threads each of `ranks` CPU ranks on this machine gets: the cores this job may use shared
    out among them, or None where OMP_NUM_THREADS is set (the user's choice, which torch reads).
    With torch's default of one thread per core in every rank, a rank's idle threads spin on the
    cores the others compute on."""
    if "OMP_NUM_THREADS" in os.environ:
        return None
    return max(1, usable_cores() // ranks)


def crowded_cpu_ranks(kind: str, ranks: int) -> str | None:
    """A warning where `ranks` CPU ranks outnumber the cores this job may use (None: they do not,
    or the ranks are CUDA's): ranks sharing a core wait on each other at every collective."""
    cores = usable_cores()
    if kind != "cpu" or ranks <= cores:
        return None
    return (
        f"--nproc-per-node {ranks}: {ranks} CPU ranks on the {cores} core{'s' if cores != 1 else ''} "
        "this job may use: ranks that share a core take turns on it and wait on each other at "
        f"every collective; start at most {cores} here unless you mean to"
    )


def no_gpu_device() -> bool:
    """This Linux host has no NVIDIA GPU device (no /dev/nvidia<N>, no WSL's /dev/dxg) or hides
    them all (CUDA_VISIBLE_DEVICES): train.device = "auto" is then the CPU, decided without
    importing torch (seconds), so a job's checks before its ranks stay quick. False wherever it
    cannot tell (another OS) or torch is loaded already (it costs nothing more): torch decides."""
    if "torch" in sys.modules:
        return False
    if _gpus_hidden():
        return True
    if not os.path.isdir("/proc/driver") or not os.path.isdir("/dev"):
        return False
    names = os.listdir("/dev")
    return "dxg" not in names and not any(n.startswith("nvidia") and n[6:].isdigit() for n in names)
