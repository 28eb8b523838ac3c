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
import zipfile
from pathlib import Path

import pytest

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


def _fake_gpu_path(tmp_path: Path, driver: str | None, present: bool = True) -> dict[str, str]:
    """An environment whose PATH has an nvidia-smi of `driver` (None: one that fails) first."""
    from helpers import fake_nvidia_smi

    bin_dir = tmp_path / "bin"
    if present:
        fake_nvidia_smi(bin_dir, driver)
    return {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}


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
        env=_fake_gpu_path(tmp_path, driver),
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == kind and done.stderr == ""


def test_no_gpu_or_a_driver_too_old_for_any_cuda_build_is_the_cpu_kind(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "requirements" / "machine.py"), "kind"]
    done = subprocess.run(
        cmd, env=_fake_gpu_path(tmp_path, None, present=False), capture_output=True, text=True
    )
    assert (done.returncode, done.stdout.strip()) == (0, "cpu")
    done = subprocess.run(
        cmd, env=_fake_gpu_path(tmp_path, "470.256.02"), capture_output=True, text=True
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
        env=_fake_gpu_path(tmp_path, driver, present=driver is not None),
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


def _wheel(directory: Path, name: str, version: str) -> None:
    """A minimal wheel: enough metadata for pip's resolver (`--dry-run --report`)."""
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(directory / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n",
        )
        whl.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        whl.writestr(f"{info}/RECORD", "")


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
        _wheel(index, name, version)
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


# --- Offline set-up: wheels downloaded for a kind, installed from a folder; a node's own torch ---

import download_wheels  # noqa: E402


def _fake_index_for_everything(directory: Path) -> None:
    """A fake wheel (no dependencies) for every requirement a kind's download names, at a version
    its specifier accepts: the package indexes, offline."""
    from packaging.requirements import Requirement

    lines = []
    for name in ("cpu.txt", "torchrec-deps.txt", "torchrec.txt"):
        lines += (ROOT / "requirements" / name).read_text().splitlines()
    lines += download_wheels.project_requirements()
    directory.mkdir(exist_ok=True)
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        req = Requirement(line)
        pins = [s.version for s in req.specifier if s.operator in ("==", ">=")]
        version = "2.13.0+cpu" if req.name == "torch" else (pins[0] if pins else "1.0")
        _wheel(directory, req.name.replace("-", "_"), version)


def _offline_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull}


def test_the_wheels_of_a_kind_download_into_one_folder_that_setup_resolves_offline(
    tmp_path: Path,
) -> None:
    index, out = tmp_path / "index", tmp_path / "wheels"
    _fake_index_for_everything(index)
    script = ROOT / "requirements" / "download_wheels.py"
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            "cpu",
            str(out),
            "--",
            "--no-index",
            "--find-links",
            str(index),
        ],
        capture_output=True,
        text=True,
        env=_offline_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = {p.name.split("-")[0].lower() for p in out.glob("*.whl")}
    assert {"torch", "fbgemm_gpu_cpu", "torchrec", "torchmetrics", "setuptools", "pytest"} <= got
    assert done.stdout.strip().endswith(f"on the node: make setup WHEELS={out}")
    # What `make setup WHEELS=out` installs resolves from that folder alone.
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed"]
    cmd += ["--no-index", "--find-links", str(out), "-r", str(ROOT / "requirements" / "cpu.txt")]
    cmd += ["-r", str(ROOT / "requirements" / "torchrec-deps.txt")]
    resolved = subprocess.run(cmd, capture_output=True, text=True, env=_offline_env())
    assert resolved.returncode == 0, resolved.stderr[-3000:]


def test_a_failed_download_is_one_line_naming_the_command(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "requirements" / "download_wheels.py"),
            "cuda",
            str(tmp_path / "w"),
            "--",
            "--no-index",
            "--find-links",
            str(tmp_path / "empty"),
        ],
        capture_output=True,
        text=True,
        env=_offline_env(),
    )
    assert done.returncode == 1
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith("download_wheels: pip download failed (exit 1): ")
    )


def test_another_nodes_python_and_platform_take_binary_wheels_only() -> None:
    assert download_wheels.target_args(None, []) == []
    assert download_wheels.target_args("3.12", list(download_wheels.PLATFORMS[:1])) == [
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--platform",
        "manylinux_2_28_x86_64",
    ]


def test_setup_from_a_wheel_folder_asks_no_index(tmp_path: Path) -> None:
    out = subprocess.run(
        ["make", "-n", "setup", f"VENV={tmp_path / 'venv'}", f"PYTHON={sys.executable}"],
        cwd=ROOT,
        env={**_fake_gpu_path(tmp_path, None, present=False), "SHARDREC_WHEELS": "/mnt/w"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installs = [line for line in out.splitlines() if "/pip install" in line]
    assert len(installs) == 3 and all("--no-index --find-links /mnt/w" in i for i in installs)
    assert "--upgrade pip" not in out and "install-args cpu  offline" in out


def _python_with_torch(tmp_path: Path, version: str) -> dict[str, str]:
    """An environment whose Python finds a torch `version` of its own (a dist-info first on its
    path) and an nvidia-smi of driver 580."""
    site = tmp_path / "site"
    info = site / f"torch-{version}.dist-info"
    info.mkdir(parents=True)
    requires = "" if "+" in version else "Requires-Dist: nvidia-cuda-runtime==13.0.96\n"
    info.joinpath("METADATA").write_text(
        f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n{requires}"
    )
    return {**_fake_gpu_path(tmp_path, "580.65.06"), "PYTHONPATH": str(site)}


@pytest.mark.parametrize(
    "version, kind, fbgemm",
    [
        ("2.13.0", "cuda", "fbgemm-gpu==1.8.0"),
        ("2.13.0+cu126", "cuda126", "fbgemm-gpu==1.8.0+cu126"),
    ],
)
def test_a_nodes_own_cuda_torch_of_a_supported_triple_is_kept(
    tmp_path: Path, version: str, kind: str, fbgemm: str
) -> None:
    env = _python_with_torch(tmp_path, version)
    venv = tmp_path / "venv"
    out = subprocess.run(
        ["make", "-n", "setup", f"VENV={venv}", f"PYTHON={sys.executable}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"-m venv --system-site-packages {venv}" in out
    assert f"install-args {kind} system" in out and f"touch {venv}/.shardrec-setup-{kind}" in out
    args = machine.install_args(kind, system=True, offline=True)
    assert fbgemm in args and not any(a.startswith("torch") for a in args)
    assert "-r" not in args  # its pins, not the file with torch's


def test_a_nodes_torch_of_another_release_is_left_alone_and_said_so(tmp_path: Path) -> None:
    env = _python_with_torch(tmp_path, "2.11.0+cu130")
    done = subprocess.run(
        [sys.executable, str(ROOT / "requirements" / "machine.py"), "system-torch"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == ""
    assert done.stderr.strip() == (
        "make setup: this Python's torch 2.11.0+cu130 is no CUDA build of a supported triple "
        "(torch 2.13.0 + fbgemm-gpu 1.8.0 + torchrec 1.8.0; CUDA 13 or 12.6 builds): installing "
        "the pinned torch into .venv"
    )
    assert machine.system_torch_kind("2.13.0+cu128", ["nvidia-x"])[0] == ""  # no fbgemm build
    assert machine.system_torch_kind("2.13.0+cpu", []) == ("", "")  # a CPU build: not kept


def test_the_supported_triples_are_the_known_good_ones() -> None:
    """make setup's table and the trainer's check name the same triples; `make test` runs on the
    CPU build of each (this .venv's)."""
    from shardrec.trainer.job.versions import KNOWN_GOOD, found_stack, is_known_good

    assert sorted((t, f, r) for t, (f, r) in machine.SUPPORTED.items()) == sorted(KNOWN_GOOD)
    assert is_known_good(found_stack())
