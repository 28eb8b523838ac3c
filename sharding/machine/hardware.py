"""The machine at hand: its CUDA devices and their memory, and the topology they make (the check
at start that a plan's estimate fits each rank's device is sharding/plan/device_fit.py's).

`shardrec plan --topology auto` (the default) plans for what this machine has: its CUDA
devices (count, model, free memory from torch.cuda.mem_get_info), else the cpu-gloo preset.
A GPU is matched to the preset of its model for bandwidths (a100, h100, h200; another model
gets the a100 figures and says so); its memory is what the device has free at plan time, and
the host memory its UVM tables may use is this host's available memory (MemAvailable), shared
out among its local ranks, of which the plan fills 85% as it does of HBM.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path

from shardrec.sharding.machine.topology import ClusterTopology, build_topology

logger = logging.getLogger(__name__)

MODEL_PRESETS = (
    ("H200", "h200"),
    ("H100", "h100"),
    ("H800", "h100"),
    ("A100", "a100"),
    ("A800", "a100"),
)
"""Substring of torch.cuda.get_device_name -> the preset whose bandwidths it has."""
FALLBACK_PRESET = "a100"
HOST_USABLE_FRACTION = 0.85
"""The share of the host's available memory a plan gives UVM tables (HBM's, torchrec's 15% kept
free: the ranks' own memory, the loaders and the page cache grow while training)."""


def available_memory_bytes() -> int | None:
    """This host's available memory: MemAvailable of /proc/meminfo, else the free physical pages
    (os.sysconf); None where neither says."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError):
        return None


@dataclass(frozen=True)
class DeviceMemory:
    """One CUDA device as torch sees it."""

    name: str
    """torch.cuda.get_device_name, e.g. "NVIDIA H200"."""
    total_bytes: int
    free_bytes: int
    host_available_bytes: int = 0
    """Available memory of the device's host when it was asked (available_memory_bytes; 0:
    unknown), which every local rank's UVM tables share."""


def query_cuda_devices() -> list[DeviceMemory]:
    """Every visible CUDA device with its memory (none without CUDA). Creates a context on each."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [cuda_device_memory(index) for index in range(torch.cuda.device_count())]


def cuda_device_memory(index: int) -> DeviceMemory:
    """One CUDA device as this process can use it: its free memory plus what this process's caching
    allocator already holds (the dense layers, built before the check, are in the plan's estimate
    too)."""
    import torch

    free, total = torch.cuda.mem_get_info(index)
    held = torch.cuda.memory_reserved(index)
    host = available_memory_bytes() or 0
    return DeviceMemory(torch.cuda.get_device_name(index), int(total), int(free) + int(held), host)


def preset_for(device_name: str) -> str:
    """The preset of a GPU model (FALLBACK_PRESET for one not in MODEL_PRESETS)."""
    for marker, preset in MODEL_PRESETS:
        if marker in device_name.upper():
            return preset
    return FALLBACK_PRESET


def detect_topology(
    world_size: int,
    local_world_size: int | None = None,
    profile: str | Path | None = None,
    devices: list[DeviceMemory] | None = None,
) -> ClusterTopology:
    """The topology of this machine: its CUDA devices, else cpu-gloo.

    Args:
        local_world_size: ranks per host (default: one per device, at most world_size).
        profile: a calibration profile (topology.load_profile) whose figures win.
        devices: the devices to plan for, every one of them used (default: this machine's,
            query_cuda_devices(), of which the first local_world_size are used); the trainer passes
            each rank's own, gathered, so that no rank opens a context on another's device.
    """
    if devices is None:
        host = available_memory_bytes() or 0
        devices = [replace(d, host_available_bytes=host) for d in query_cuda_devices()]
        used = devices[: local_world_size or min(len(devices), world_size)]
    else:
        used = devices
    if not devices:
        return build_topology("cpu-gloo", world_size, local_world_size, profile=profile)
    preset = preset_for(devices[0].name)
    if preset == FALLBACK_PRESET and FALLBACK_PRESET.upper() not in devices[0].name.upper():
        logger.warning(
            "%s: no preset for this GPU model; planning with the %s bandwidths",
            devices[0].name,
            preset,
        )
    lws = local_world_size or min(len(devices), world_size)
    # One memory figure for every rank: the smallest free, so that the plan fits each of them.
    free = min(d.free_bytes for d in used)
    topo = build_topology(preset, world_size, lws, free, profile)
    return replace(topo, memory_source="device", host_memory_bytes=host_share(used, lws, topo))


def host_share(devices: list[DeviceMemory], local_world_size: int, topo: ClusterTopology) -> int:
    """Host memory per rank for UVM tables: the least available memory the devices' hosts
    reported, shared out among the local ranks (HOST_USABLE_FRACTION of it); the preset's figure,
    with a warning, where no host said."""
    known = [d.host_available_bytes for d in devices if d.host_available_bytes > 0]
    if not known:
        logger.warning(
            "this host's available memory is unknown: UVM tables are planned with the %s preset's "
            "%.0f GiB of host memory per rank",
            topo.name,
            topo.host_memory_bytes / 2**30,
        )
        return topo.host_memory_bytes
    return int(min(known) * HOST_USABLE_FRACTION) // max(1, local_world_size)
