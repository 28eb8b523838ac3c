"""`make setup` takes the CPU build of torch on a machine without a GPU, whatever pip's indexes.

The resolution is checked with pip's resolver only (`--dry-run --report`): nothing installed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "requirements"))
import torch_index  # noqa: E402

CUDA_WHEEL = {
    "metadata": {
        "name": "torch",
        "version": "2.13.0",
        "requires_dist": ["filelock", "nvidia-cuda-runtime-cu12==12.8.90; platform_system == 'Linux'"],
    }
}
CPU_WHEEL = {"metadata": {"name": "torch", "version": "2.13.0+cpu", "requires_dist": ["filelock"]}}
MAC_WHEEL = {"metadata": {"name": "torch", "version": "2.13.0", "requires_dist": ["filelock", "sympy"]}}


def test_cpu_and_cuda_builds_are_told_apart():
    assert not torch_index.is_cpu_build(CUDA_WHEEL)
    assert torch_index.is_cpu_build(CPU_WHEEL)
    assert torch_index.is_cpu_build(MAC_WHEEL)


@pytest.mark.parametrize("resolved, expected", [(CUDA_WHEEL, torch_index.CPU_INDEX_ARGS), (CPU_WHEEL, []), (None, [])])
def test_pytorch_cpu_index_only_where_the_configured_indexes_give_cuda(monkeypatch, resolved, expected):
    monkeypatch.setattr(torch_index, "resolve", lambda requirement, extra: resolved)
    assert torch_index.index_args("torch==2.13.0") == expected


def test_pin_is_read_from_the_cpu_requirements():
    assert torch_index.torch_pin(ROOT / "requirements" / "cpu.txt") == "torch==2.13.0"


def test_setup_resolves_a_cpu_torch_on_this_machine():
    """What `make setup` would install here, asked of pip without installing."""
    args = subprocess.run(
        [sys.executable, str(ROOT / "requirements" / "torch_index.py"), str(ROOT / "requirements" / "cpu.txt")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    item = torch_index.resolve("torch==2.13.0", args)
    assert item is not None, "pip could not resolve torch==2.13.0"
    assert torch_index.is_cpu_build(item), item["metadata"]
