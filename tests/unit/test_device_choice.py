"""train.device = "auto" is CUDA where torch can use it. A GPU host where it cannot (a CPU build of
torch, a driver too old for torch's CUDA) is told why in one line before any rank starts, instead
of training on the CPU without a word; so is a job with more local ranks than GPUs.

The GPU host is faked: an `nvidia-smi` on PATH, and torch's CUDA queries monkeypatched."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import write_tiny_dataset
from helpers import assert_one_line_error, fake_nvidia_smi
from typer.testing import CliRunner

from shardrec.tools.cli.app import app
from shardrec.trainer.distributed.devices import (
    check_ranks_fit,
    cuda_unusable_reason,
    resolve_device_kind,
)

JOB = ["--set", "train.global_batch_size=64"]


@pytest.fixture
def gpu_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Make this a host whose nvidia-smi lists GPUs of a given driver, torch seeing none of them."""

    def make(
        driver: str | None = "550.54.15", gpus: int = 2, torch_cuda: str | None = "13.0"
    ) -> None:
        fake_nvidia_smi(tmp_path / "bin", driver, gpus)
        monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setattr(torch.version, "cuda", torch_cuda)

    return make


def test_auto_on_a_gpu_host_whose_driver_is_too_old_says_so_in_one_line(
    gpu_host, tiny_dataset: Path
) -> None:
    gpu_host(driver="550.54.15", torch_cuda="13.0")
    expected = (
        f"train.device = 'auto': this machine has 2 NVIDIA GPUs but NVIDIA driver 550.54.15 is too old for torch "
        f"{torch.__version__} (CUDA 13.0 needs driver 580 or newer): run `make setup` (it installs the CUDA 12.6 "
        'build for this driver) or update the driver, or set train.device = "cpu" to train on the CPU'
    )
    with pytest.raises(ValueError) as e:
        resolve_device_kind("auto")
    assert str(e.value) == expected
    result = CliRunner().invoke(app, ["train", "--data", str(tiny_dataset), *JOB])
    assert_one_line_error(result, "^error: " + re.escape(expected) + "$")
    assert resolve_device_kind("cpu") == "cpu"  # the way to train on the CPU anyway


def test_auto_on_a_gpu_host_with_a_cpu_build_of_torch_says_so(gpu_host) -> None:
    gpu_host(driver="580.65.06", torch_cuda=None)
    with pytest.raises(
        ValueError,
        match=r"2 NVIDIA GPUs \(nvidia-smi\) but torch \S+ is a CPU build: run `make setup`",
    ):
        resolve_device_kind("auto")


def test_explicit_cuda_names_why_it_is_not_available(gpu_host) -> None:
    gpu_host(driver="535.104.05", gpus=1, torch_cuda="13.0")
    assert "1 NVIDIA GPU but NVIDIA driver 535.104.05 is too old" in (cuda_unusable_reason() or "")
    gpu_host(driver="580.65.06", gpus=1, torch_cuda="13.0")
    assert "cannot use them (torch.cuda.is_available() is False)" in (cuda_unusable_reason() or "")


@pytest.mark.parametrize("case", ["no nvidia-smi", "nvidia-smi fails", "GPUs hidden"])
def test_auto_is_the_cpu_where_no_gpu_is_meant_to_be_used(
    gpu_host, monkeypatch: pytest.MonkeyPatch, case
) -> None:
    if case == "no nvidia-smi":
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setenv("PATH", "/nonexistent")
    elif case == "nvidia-smi fails":
        gpu_host(driver=None)
    else:
        gpu_host(driver="550.54.15")
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert resolve_device_kind("auto") == "cpu"


def test_more_local_ranks_than_gpus_is_refused_before_any_rank_starts(
    monkeypatch: pytest.MonkeyPatch, tiny_dataset: Path
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    result = CliRunner().invoke(
        app, ["train", "--data", str(tiny_dataset), "--nproc-per-node", "2", *JOB]
    )
    assert_one_line_error(
        result,
        r"^error: --nproc-per-node 2: this machine has 1 CUDA device and each CUDA rank needs one of its own; "
        r"start at most 1 rank here, or set train.device = \"cpu\" to train on the CPU$",
    )
    check_ranks_fit("cuda", 1)
    check_ranks_fit("cpu", 2)  # CPU ranks need no GPU


def test_eval_of_a_run_with_more_ranks_than_gpus_names_where_the_count_came_from(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A run trained on 2 ranks (device "auto"), evaluated on a host with 1 GPU: eval's default
    rank count is the run's, so the line names that, not a flag the user did not type, and offers
    --nproc-per-node (the checkpoint reshards), not the trainer's "train on the CPU"."""
    write_tiny_dataset(tmp_path / "data")  # the fixture run's dataset (tests/fixtures/README.md)
    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "run-killed-at-step-6", run)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    tail = (
        r": this machine has 1 CUDA device and each CUDA rank needs one of its own; start at most 1 rank here "
        r"\(--nproc-per-node: the checkpoint is resharded to any rank count\), or evaluate on CPU ranks "
        r"with --device cpu$"
    )
    result = CliRunner().invoke(app, ["eval", str(run), "--data", str(tmp_path / "data")])
    assert_one_line_error(
        result, r"^error: the run's world size, 2 ranks \(eval's default --nproc-per-node\)" + tail
    )
    result = CliRunner().invoke(
        app, ["eval", str(run), "--data", str(tmp_path / "data"), "--nproc-per-node", "2"]
    )
    assert_one_line_error(result, r"^error: --nproc-per-node 2" + tail)


def _run_trained_on_cuda(tmp_path: Path) -> tuple[Path, Path]:
    """The fixture run (2 ranks) as a CUDA run records itself: train.device = "cuda"."""
    write_tiny_dataset(tmp_path / "data")
    run = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "run-killed-at-step-6", run)
    config = run / "config.toml"
    config.write_text(config.read_text().replace('device = "auto"', 'device = "cuda"', 1))
    return run, tmp_path / "data"


def test_eval_of_a_cuda_run_on_cpu_ranks_is_checked_against_the_cpu_not_train_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A run trained on CUDA, evaluated on 2 CPU ranks of a 1-GPU host: the rank check is the
    eval device's (CPU ranks need no GPU), not the run's train.device."""
    from shardrec.trainer.inference.eval_request import EvalRequest, check_request

    run, data = _run_trained_on_cuda(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    config, _ = check_request(EvalRequest(run, data=data, device="cpu"), 2)
    assert config.train.device == "cuda"
    with pytest.raises(ValueError, match=r"^--nproc-per-node 2: this machine has 1 CUDA device"):
        check_request(EvalRequest(run, data=data, device="cuda"), 2)
    with pytest.raises(ValueError, match=r"^--nproc-per-node 2: this machine has 1 CUDA device"):
        check_request(EvalRequest(run, data=data, device="auto"), 2)  # auto: this host's, CUDA
    result = CliRunner().invoke(app, ["eval", str(run), "--data", str(data), "--device", "gpu"])
    assert_one_line_error(result, r"^error: --device 'gpu' is not one of auto, cpu, cuda$")


def test_eval_on_cuda_where_torch_has_none_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    run, data = _run_trained_on_cuda(tmp_path)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: no GPU at all
    result = CliRunner().invoke(app, ["eval", str(run), "--data", str(data), "--device", "cuda"])
    assert_one_line_error(
        result,
        r"^error: --device cuda: torch \S+ sees no CUDA device here; evaluate on the CPU with "
        r"--device cpu$",
    )


def test_train_on_cuda_where_there_is_none_says_how_to_train_on_the_cpu(
    tiny_dataset: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("PATH", "/nonexistent")  # no nvidia-smi: no GPU at all
    result = CliRunner().invoke(
        app, ["train", "--data", str(tiny_dataset), *JOB, "--set", 'train.device="cuda"']
    )
    assert_one_line_error(
        result,
        r"^error: --set 'train.device=\"cuda\"': train.device = 'cuda' but CUDA is not available "
        r"here; train on the CPU with "
        r'train.device = "cpu" \(or "auto"\)$',
    )
