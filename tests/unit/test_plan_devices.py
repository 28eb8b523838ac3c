"""Planning for the machine at hand: `shardrec plan --topology auto` (the default) finds its CUDA
devices and their free memory (faked here: this host has none), a plan made for another device kind
is refused naming --topology, and at start a plan larger than a device's free memory is refused
with each rank's gap."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from shardrec.sharding.machine import hardware
from shardrec.sharding.machine.hardware import DeviceMemory, detect_topology
from shardrec.sharding.plan.device_fit import check_plan_fits_devices
from shardrec.sharding.plan.plan_file import check_plan, load_plan
from shardrec.sharding.plan.plan_types import PlanDoesNotFitError, StalePlanError
from shardrec.sharding.plan.report import fmt_bytes
from shardrec.tools.cli.app import app

GiB = 2**30
H200 = DeviceMemory("NVIDIA H200", 150_000_000_000, 148_500_000_000)


def test_auto_topology_is_the_machine_s_gpus(monkeypatch) -> None:
    monkeypatch.setattr(hardware, "query_cuda_devices", lambda: [H200] * 8)
    topo = detect_topology(16)
    assert (topo.name, topo.device_kind, topo.local_world_size, topo.num_hosts) == (
        "h200",
        "cuda",
        8,
        2,
    )
    assert topo.memory_bytes == H200.free_bytes and topo.memory_source == "device"
    assert topo.usable_bytes == int(H200.free_bytes * 0.85)  # torchrec's 15% kept free
    # One GPU of another model: a100's bandwidths, the device's own memory, as many ranks per host
    # as GPUs.
    l4 = DeviceMemory("NVIDIA L4", 24 * GiB, 22 * GiB)
    monkeypatch.setattr(hardware, "query_cuda_devices", lambda: [l4])
    topo = detect_topology(2)
    assert (topo.name, topo.memory_bytes, topo.local_world_size) == ("a100", 22 * GiB, 1)
    monkeypatch.setattr(hardware, "query_cuda_devices", lambda: [])
    assert detect_topology(2).name == "cpu-gloo"


def test_uvm_tables_are_planned_for_this_host_s_available_memory(monkeypatch) -> None:
    """Not the preset's 192 GiB per GPU: the host's MemAvailable, shared out among its local ranks
    (85% of it, as of HBM)."""
    monkeypatch.setattr(hardware, "query_cuda_devices", lambda: [H200] * 8)
    monkeypatch.setattr(hardware, "available_memory_bytes", lambda: 100 * GiB)
    assert detect_topology(16).host_memory_bytes == int(100 * GiB * 0.85) // 8
    assert detect_topology(2).host_memory_bytes == int(100 * GiB * 0.85) // 2  # 2 local ranks
    # Each rank's own report at start (gather_devices): the least of the hosts counts.
    ranks = [dataclasses.replace(H200, host_available_bytes=b) for b in (64 * GiB, 32 * GiB)]
    assert detect_topology(2, 1, devices=ranks).host_memory_bytes == int(32 * GiB * 0.85)
    monkeypatch.setattr(hardware, "available_memory_bytes", lambda: None)
    assert detect_topology(16).host_memory_bytes == 192 * GiB  # unknown: the preset, with a warning


def test_available_memory_is_read_from_meminfo_or_sysconf() -> None:
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        line = next(x for x in meminfo.read_text().splitlines() if x.startswith("MemAvailable:"))
        expected = int(line.split()[1]) * 1024
        assert abs(hardware.available_memory_bytes() - expected) < 2 * GiB  # it moves meanwhile
    assert hardware.available_memory_bytes() > 0


def test_plan_defaults_to_this_machine(tiny_dataset: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(hardware, "query_cuda_devices", lambda: [H200] * 2)
    out = tmp_path / "plan.json"
    res = CliRunner().invoke(app, ["plan", "--data", str(tiny_dataset), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "planned 4 tables for 2 ranks (auto: h200, memory from the device)" in " ".join(
        res.stdout.split()
    )
    plan = load_plan(out)
    assert plan.fingerprint.device_kind == "cuda"
    assert plan.topology.memory_bytes == H200.free_bytes and plan.topology.memory_source == "device"
    # A job that trains on CPU (train.device = "cpu", as the demo's) plans for CPU on a GPU host
    # too.
    res = CliRunner().invoke(
        app, ["plan", "--data", str(tiny_dataset), "--out", str(out), "--set", "train.device=cpu"]
    )
    assert res.exit_code == 0, res.output
    assert load_plan(out).fingerprint.device_kind == "cpu"
    monkeypatch.setattr(hardware, "query_cuda_devices", lambda: [])
    res = CliRunner().invoke(
        app, ["plan", "--data", str(tiny_dataset), "--out", str(out), "--json"]
    )
    assert res.exit_code == 0, res.output
    assert load_plan(out).fingerprint.device_kind == "cpu"
    assert json.loads(res.stdout)["world_size"] == 2


def test_plan_for_another_device_kind_names_topology(tiny_dataset: Path, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    res = CliRunner().invoke(
        app, ["plan", "--data", str(tiny_dataset), "--out", str(out), "--topology", "cpu-gloo"]
    )
    assert res.exit_code == 0, res.output
    plan = load_plan(out)
    fp = dataclasses.replace(plan.fingerprint, device_kind="cuda", digest="other")
    with pytest.raises(StalePlanError) as e:
        check_plan(plan, fp)
    assert str(e.value) == (
        "the plan was made for another job: device kind: plan cpu, job cuda (re-run `shardrec plan` with "
        "`--topology auto` on the machine that trains, or a preset of its cuda devices (`--topology a100`, "
        "`h100`, `h200`))"
    )
    cpu = dataclasses.replace(plan.fingerprint, digest="other", world_size=3)
    plan = dataclasses.replace(
        plan, fingerprint=dataclasses.replace(plan.fingerprint, device_kind="cuda")
    )
    with pytest.raises(StalePlanError) as e:
        check_plan(plan, cpu)
    assert str(e.value).endswith("or a preset of its cpu devices (`--topology cpu-gloo`))")


def test_start_refuses_a_plan_larger_than_a_device_s_free_memory(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    out = tmp_path / "plan.json"
    res = CliRunner().invoke(
        app, ["plan", "--data", str(tiny_dataset), "--out", str(out), "--world-size", "2"]
    )
    assert res.exit_code == 0, res.output
    plan = load_plan(out)
    need = [r.memory_bytes for r in plan.estimate.ranks]
    check_plan_fits_devices(plan, [need[0], need[1]])  # exactly enough: starts
    with pytest.raises(PlanDoesNotFitError) as e:
        check_plan_fits_devices(plan, [need[0], need[1] - 2**20], "cuda")
    assert str(e.value).startswith(
        f"the plan does not fit the devices: rank 1 needs {need[1] / 2**20:.2f} MiB of HBM by the plan's estimate, "
        "its device has "
        f"{(need[1] - 2**20) / 2**20:.2f} MiB free: 1.00 MiB short ("
    )
    assert "rank 0" not in str(e.value)


def _start_on_a_fake_gpu(
    dataset: Path, monkeypatch, free_bytes: int, plan=None, host_bytes: int = 500 * GiB
):
    """build_sharded_model on one CUDA rank of `free_bytes` free, faked: the dense layers stay on
    the CPU and sharding (which would allocate the tables) returns "sharded" instead of running."""
    import torch

    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.trainer.distributed.dist import DistEnv
    from shardrec.trainer.job.config import JobConfig
    from shardrec.trainer.model import build

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (free_bytes, H200.total_bytes))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: H200.name)
    monkeypatch.setattr(hardware, "available_memory_bytes", lambda: host_bytes)
    monkeypatch.setattr(
        hardware, "query_cuda_devices", lambda: pytest.fail("a rank asked for every device")
    )
    real_module = build.build_train_module
    monkeypatch.setattr(
        build,
        "build_train_module",
        lambda *a, **kw: real_module(*a[:3], dataclasses.replace(a[3], device=cpu), **kw),
    )

    monkeypatch.setattr(build, "shard_model", lambda *args, **kwargs: "sharded")
    cpu, job = torch.device("cpu"), JobConfig()
    job.train.global_batch_size = 64
    env = DistEnv(0, 0, 1, 1, torch.device("cuda", 0), "nccl")
    kw = dict(
        model_config=job.model, train=job.train, optim=job.optim, sharding=job.sharding, plan=plan
    )
    return lambda: build.build_sharded_model(Manifest.load(dataset), env, **kw)


def test_a_plan_made_at_start_on_a_gpu_is_for_that_gpu_s_model_and_free_memory(
    tiny_dataset: Path, monkeypatch
):
    start = _start_on_a_fake_gpu(tiny_dataset, monkeypatch, 20 * GiB)
    model, _, plan = start()
    assert model == "sharded"
    assert (plan.topology.name, plan.topology.memory_bytes, plan.topology.memory_source) == (
        "h200",
        20 * GiB,
        "device",
    )
    assert plan.fingerprint.device_kind == "cuda"
    assert plan.topology.host_memory_bytes == int(500 * GiB * 0.85)  # this host's, one rank


def test_start_refuses_a_plan_whose_uvm_tables_exceed_the_host_s_memory_before_sharding(
    tiny_dataset: Path, monkeypatch
):
    plan = _cuda_plan(tiny_dataset)
    ranks = [dataclasses.replace(r, host_bytes=300 * GiB) for r in plan.estimate.ranks]
    uvm = dataclasses.replace(plan, estimate=dataclasses.replace(plan.estimate, ranks=ranks))
    start = _start_on_a_fake_gpu(tiny_dataset, monkeypatch, 100 * GiB, uvm, host_bytes=300 * GiB)
    assert start()[0] == "sharded"  # exactly enough
    with pytest.raises(PlanDoesNotFitError) as e:
        _start_on_a_fake_gpu(tiny_dataset, monkeypatch, 100 * GiB, uvm, host_bytes=250 * GiB)()
    assert str(e.value) == (
        "the plan does not fit host memory: host 0 (rank 0) would keep 300.00 GiB of UVM tables in "
        "its memory by the plan's estimate, it has 250.00 GiB available: 50.00 GiB short (managed "
        "memory beyond the host's can hang the GPU; free host memory, or re-plan on this machine "
        "with `shardrec plan --topology auto`, which plans UVM tables for its available memory)"
    )


def test_start_on_a_gpu_refuses_a_plan_larger_than_its_free_memory_before_sharding(
    tiny_dataset: Path, monkeypatch
):
    plan = _cuda_plan(tiny_dataset)
    need = plan.estimate.ranks[0].memory_bytes
    assert (
        _start_on_a_fake_gpu(tiny_dataset, monkeypatch, need, plan)()[0] == "sharded"
    )  # exactly enough
    with pytest.raises(PlanDoesNotFitError) as e:
        _start_on_a_fake_gpu(tiny_dataset, monkeypatch, need // 4, plan)()
    assert str(e.value) == (
        f"the plan does not fit the devices: rank 0 (cuda:0, NVIDIA H200) needs {fmt_bytes(need)} of HBM by the "
        f"plan's estimate, its device has {fmt_bytes(need // 4)} free: {fmt_bytes(need - need // 4)} short (free the "
        "devices' memory, or re-plan for them on this machine with `shardrec plan --topology auto`, which keeps "
        "the tables that do not fit in host memory behind UVM caches)"
    )


def _cuda_plan(dataset: Path):
    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.embeddings.tables import build_table_configs
    from shardrec.sharding.machine.topology import build_topology
    from shardrec.sharding.planner import plan_tables
    from shardrec.sharding.search.request import PlanRequest

    tables = build_table_configs(Manifest.load(dataset), 16)
    return plan_tables(PlanRequest(tables, 1, 1, 64, "cuda", topology=build_topology("h200", 1)))
