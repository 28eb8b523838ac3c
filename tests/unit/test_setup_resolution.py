"""`make setup` takes the build of the pinned stack this machine needs: the CPU build of torch on a
machine without a GPU, whatever pip's indexes; CUDA 13 builds for a driver of 580 or newer, the CUDA
12.6 builds for an older one; one stamp per device kind, another kind's build uninstalled first.

The resolution is checked with pip's resolver only (`--dry-run --report`): nothing installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from setup_fakes import fake_gpu_env, fake_wheel

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "requirements"))
import machine  # noqa: E402
import torch_index  # noqa: E402

CUDA_WHEEL = {
    "metadata": {
        "name": "torch",
        "version": "2.13.0",
        "requires_dist": [
            "filelock",
            "nvidia-cuda-runtime-cu12==12.8.90; platform_system == 'Linux'",
        ],
    }
}
CPU_WHEEL = {"metadata": {"name": "torch", "version": "2.13.0+cpu", "requires_dist": ["filelock"]}}
MAC_WHEEL = {
    "metadata": {"name": "torch", "version": "2.13.0", "requires_dist": ["filelock", "sympy"]}
}


def test_cpu_and_cuda_builds_are_told_apart():
    assert not torch_index.is_cpu_build(CUDA_WHEEL)
    assert torch_index.is_cpu_build(CPU_WHEEL)
    assert torch_index.is_cpu_build(MAC_WHEEL)


@pytest.mark.parametrize(
    "resolved, expected", [(CUDA_WHEEL, torch_index.CPU_INDEX_ARGS), (CPU_WHEEL, []), (None, [])]
)
def test_pytorch_cpu_index_only_where_the_configured_indexes_give_cuda(
    monkeypatch, resolved, expected
):
    monkeypatch.setattr(torch_index, "resolve", lambda requirement, extra: resolved)
    assert torch_index.index_args("torch==2.13.0") == expected


def test_pin_is_read_from_the_cpu_requirements():
    assert torch_index.torch_pin(ROOT / "requirements" / "cpu.txt") == "torch==2.13.0"


def test_setup_resolves_a_cpu_torch_on_this_machine():
    """What `make setup` would install here, asked of pip without installing."""
    args = subprocess.run(
        [
            sys.executable,
            str(ROOT / "requirements" / "torch_index.py"),
            str(ROOT / "requirements" / "cpu.txt"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    item = torch_index.resolve("torch==2.13.0", args)
    assert item is not None, "pip could not resolve torch==2.13.0"
    assert torch_index.is_cpu_build(item), item["metadata"]


# --- The build for this machine's device kind (requirements/machine.py, the Makefile's stamp) ---


@pytest.mark.parametrize(
    "driver, kind",
    [
        ("590.44.01", "cuda"),
        ("580.65.06", "cuda"),
        ("550.54.15", "cuda126"),
        ("525.60.13", "cuda126"),
        (None, "cpu"),
    ],
)
def test_the_kind_follows_the_driver(tmp_path: Path, driver: str | None, kind: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "requirements" / "machine.py"), "kind"],
        env=fake_gpu_env(tmp_path, driver),
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == kind and done.stderr == ""


def test_no_gpu_or_a_driver_too_old_for_any_cuda_build_is_the_cpu_kind(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "requirements" / "machine.py"), "kind"]
    done = subprocess.run(
        cmd, env=fake_gpu_env(tmp_path, None, present=False), capture_output=True, text=True
    )
    assert (done.returncode, done.stdout.strip()) == (0, "cpu")
    done = subprocess.run(
        cmd, env=fake_gpu_env(tmp_path, "470.256.02"), capture_output=True, text=True
    )
    assert done.stdout.strip() == "cpu"
    assert done.stderr.strip() == (
        "make setup: NVIDIA driver 470.256.02 is older than any CUDA build of the pinned torch runs on "
        "(525 for CUDA 12.6, 580 for CUDA 13): installing the CPU build"
    )


def _make_setup_dry_run(tmp_path: Path, driver: str | None, venv: Path) -> str:
    done = subprocess.run(
        ["make", "-n", "setup", f"VENV={venv}", f"PYTHON={sys.executable}"],
        cwd=ROOT,
        env=fake_gpu_env(tmp_path, driver, present=driver is not None),
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_the_setup_stamp_is_per_device_kind(tmp_path: Path) -> None:
    """A .venv set up on a CPU node is set up again on a GPU node (a shared home directory), with
    the CUDA requirements, and again for the CPU back on the CPU node."""
    venv = tmp_path / "venv"
    venv.mkdir()
    (
        venv / ".shardrec-setup-cpu"
    ).touch()  # set up here for the CPU, after every requirement changed
    assert "Nothing to be done" in _make_setup_dry_run(tmp_path, None, venv)
    on_gpu = _make_setup_dry_run(tmp_path, "580.65.06", venv)
    assert "machine.py stale cuda" in on_gpu and "machine.py install-args cuda " in on_gpu
    assert machine.install_args("cuda") == ["-r", "requirements/cuda.txt"]
    assert (
        f"touch {venv}/.shardrec-setup-cuda" in on_gpu
        and f"rm -f {venv}/.shardrec-setup*" in on_gpu
    )
    old_driver = _make_setup_dry_run(tmp_path, "550.54.15", venv)
    assert (
        "install-args cuda126 " in old_driver
        and f"touch {venv}/.shardrec-setup-cuda126" in old_driver
    )


CPU_TORCH = ("2.13.0+cpu", ["filelock"])
CUDA_TORCH = ("2.13.0", ["filelock", "nvidia-cuda-runtime==13.0.96; platform_system == 'Linux'"])


@pytest.mark.parametrize(
    "kind, installed, stale",
    [
        (
            "cuda",
            {"torch": CPU_TORCH, "fbgemm-gpu-cpu": ("1.8.0", [])},
            ["torch", "fbgemm-gpu-cpu"],
        ),
        ("cpu", {"torch": CUDA_TORCH, "fbgemm-gpu": ("1.8.0", [])}, ["torch", "fbgemm-gpu"]),
        ("cuda126", {"torch": CUDA_TORCH, "fbgemm-gpu": ("1.8.0", [])}, ["torch", "fbgemm-gpu"]),
        (
            "cuda",
            {"torch": ("2.13.0+cu126", CUDA_TORCH[1]), "fbgemm-gpu": ("1.8.0+cu126", [])},
            ["torch", "fbgemm-gpu"],
        ),
        (
            "cuda126",
            {"torch": ("2.13.0+cu126", CUDA_TORCH[1]), "fbgemm-gpu": ("1.8.0+cu126", [])},
            [],
        ),
        (
            "cuda",
            {"torch": CUDA_TORCH, "fbgemm-gpu": ("1.8.0", []), "fbgemm-gpu-cpu": ("1.8.0", [])},
            ["fbgemm-gpu-cpu"],
        ),
        ("cpu", {}, []),
    ],
)
def test_another_kinds_build_is_uninstalled_first(
    kind: str, installed: dict, stale: list[str]
) -> None:
    assert machine.stale_packages(kind, installed) == stale


def _pip_report(tmp_path: Path, requirements: str, *extra: str) -> dict[str, str]:
    """What pip would install for `requirements` in this venv, offline: a folder of wheels stands
    for PyPI and PyTorch's CUDA 12.6 index (releases with and without the +cu126 label)."""
    index = tmp_path / "index"
    index.mkdir(exist_ok=True)
    for name, version in (
        ("torch", "2.13.0"),
        ("torch", "2.13.0+cu126"),
        ("fbgemm_gpu", "1.8.0"),
        ("fbgemm_gpu", "1.8.0+cu126"),
    ):
        fake_wheel(index, name, version)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--quiet",
        "--report",
        "-",
        "--no-deps",
    ]
    cmd += [
        "--no-index",
        "--find-links",
        str(index),
        *extra,
        "-r",
        str(ROOT / "requirements" / requirements),
    ]
    done = subprocess.run(
        cmd, capture_output=True, text=True, env={**env, "PIP_CONFIG_FILE": os.devnull}
    )
    assert done.returncode == 0, done.stderr
    return {
        item["metadata"]["name"].lower(): item["metadata"]["version"]
        for item in json.loads(done.stdout)["install"]
    }


def test_an_old_driver_gets_the_cuda126_builds_of_the_pinned_releases(tmp_path: Path) -> None:
    assert _pip_report(tmp_path, "cuda126.txt", "--ignore-installed") == {
        "torch": "2.13.0+cu126",
        "fbgemm-gpu": "1.8.0+cu126",
    }
    # In this CPU .venv too: its torch 2.13.0+cpu does not satisfy torch==2.13.0+cu126.
    assert _pip_report(tmp_path, "cuda126.txt")["torch"] == "2.13.0+cu126"


def test_the_cpu_venvs_torch_satisfies_the_cuda_pin_so_setup_uninstalls_it_first(
    tmp_path: Path,
) -> None:
    """torch==2.13.0 is satisfied by this .venv's 2.13.0+cpu: pip alone would keep the CPU build
    on a GPU node, so `make setup` uninstalls what `machine.py stale` names before installing."""
    assert "torch" not in _pip_report(tmp_path, "cuda.txt")
    assert machine.stale_packages("cuda", machine.installed_stack()) == ["torch", "fbgemm-gpu-cpu"]
    assert machine.stale_packages("cpu", machine.installed_stack()) == []


def test_the_cuda_requirements_pin_the_cpu_stacks_releases() -> None:
    def pins(name: str) -> dict[str, str]:
        lines = (ROOT / "requirements" / name).read_text().splitlines()
        return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))

    cpu, cuda, cuda126 = pins("cpu.txt"), pins("cuda.txt"), pins("cuda126.txt")
    assert cpu["torch"] == cuda["torch"] and cpu["fbgemm-gpu-cpu"] == cuda["fbgemm-gpu"]
    assert cuda126 == {name: f"{version}+cu126" for name, version in cuda.items()}
