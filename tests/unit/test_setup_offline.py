"""Offline set-up: the wheels of a device kind downloaded into one folder that `make setup` installs
from without an index, and a node's own CUDA torch kept where it is of a supported triple.

Checked with pip's resolver (`--dry-run`) and `make -n`: nothing installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from setup_fakes import fake_gpu_env, fake_wheel

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "requirements"))
import download_wheels  # noqa: E402
import machine  # noqa: E402


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
        fake_wheel(directory, req.name.replace("-", "_"), version)


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
        env={**fake_gpu_env(tmp_path, None, present=False), "SHARDREC_WHEELS": "/mnt/w"},
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
    return {**fake_gpu_env(tmp_path, "580.65.06"), "PYTHONPATH": str(site)}


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
