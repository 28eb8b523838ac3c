"""Fakes of what `make setup` inspects, for the set-up tests: a wheel with just the metadata pip's
resolver reads, and a PATH whose nvidia-smi reports a given driver."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path


def fake_wheel(directory: Path, name: str, version: str) -> None:
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


def fake_gpu_env(tmp_path: Path, driver: str | None, present: bool = True) -> dict[str, str]:
    """An environment whose PATH has an nvidia-smi of `driver` (None: one that fails) first."""
    from helpers import fake_nvidia_smi

    bin_dir = tmp_path / "bin"
    if present:
        fake_nvidia_smi(bin_dir, driver)
    return {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
