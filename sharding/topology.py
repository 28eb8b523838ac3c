"""The machines a plan is made for: ranks, hosts, memory and bandwidths, with presets.

Bandwidths are bytes per second as one rank sees them: `intra_host_bw` to a rank on the
same host, `inter_host_bw` to a rank on another host, `lookup_bw` for reading embedding
rows from the device's memory. A calibration profile (`shardrec plan calibrate`) replaces
the preset's figures with ones measured on this machine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardrec.sharding.json_checks import expect, read_strict_json

GiB = 1024**3


@dataclass(frozen=True)
class ClusterTopology:
    """The machines a plan is made for, in shardrec's cost model's terms; torchrec's own
    planner `Topology` is built from it by torchrec_planner.to_torchrec_topology."""

    name: str
    """Preset the figures came from (or "custom")."""
    world_size: int
    """Ranks in the job."""
    local_world_size: int
    """Ranks per host."""
    device_kind: str
    """cpu or cuda."""
    memory_bytes: int
    """Memory per rank available to embeddings (weights, optimizer state, buffers)."""
    intra_host_bw: float
    """Bytes/s one rank sends to another on the same host."""
    inter_host_bw: float
    """Bytes/s one rank sends to a rank on another host."""
    lookup_bw: float
    """Bytes/s of embedding rows a rank reads (pooled lookup, forward)."""
    bwd_compute_multiplier: float = 2.0
    """Backward (gradient + fused optimizer update) cost relative to the forward lookup."""
    collective_latency_s: float = 20e-6
    """Fixed cost of starting one collective."""

    def __post_init__(self) -> None:
        if self.world_size <= 0:
            raise ValueError(f"topology world_size = {self.world_size} must be > 0")
        if self.local_world_size <= 0 or self.world_size % self.local_world_size:
            raise ValueError(
                f"topology local_world_size = {self.local_world_size} must be > 0 "
                f"and divide world_size = {self.world_size}"
            )
        if self.memory_bytes <= 0:
            raise ValueError(f"topology {self.name}: memory per rank is {self.memory_bytes} bytes; it must be > 0")
        for key in ("intra_host_bw", "inter_host_bw", "lookup_bw"):
            if getattr(self, key) <= 0:
                raise ValueError(f"topology {self.name}: {key} = {getattr(self, key)} must be > 0")

    @property
    def num_hosts(self) -> int:
        return self.world_size // self.local_world_size

    def host(self, rank: int) -> int:
        return rank // self.local_world_size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Per-rank figures. GPU presets: HBM size and bandwidth of one device, NVLink bus bandwidth
# per direction, and one 200/400 Gb/s NIC per GPU for the network.
PRESETS: dict[str, dict[str, Any]] = {
    "cpu-gloo": dict(
        device_kind="cpu",
        local_world_size=0,
        memory_bytes=4 * GiB,
        intra_host_bw=2.0e9,
        inter_host_bw=1.0e9,
        lookup_bw=4.0e9,
        collective_latency_s=200e-6,
    ),
    "a100": dict(
        device_kind="cuda",
        local_world_size=8,
        memory_bytes=80 * GiB,
        intra_host_bw=240e9,
        inter_host_bw=25e9,
        lookup_bw=1.6e12,
    ),
    "h100": dict(
        device_kind="cuda",
        local_world_size=8,
        memory_bytes=80 * GiB,
        intra_host_bw=360e9,
        inter_host_bw=50e9,
        lookup_bw=2.7e12,
    ),
    "h200": dict(
        device_kind="cuda",
        local_world_size=8,
        memory_bytes=141 * GiB,
        intra_host_bw=360e9,
        inter_host_bw=50e9,
        lookup_bw=3.8e12,
    ),
}


def build_topology(
    preset: str,
    world_size: int,
    local_world_size: int | None = None,
    memory_bytes: int | None = None,
    profile: str | Path | None = None,
) -> ClusterTopology:
    """A topology from a preset, with optional overrides and a calibration profile.

    Args:
        preset: one of PRESETS.
        local_world_size: ranks per host; default the preset's (cpu-gloo: all ranks on one host).
        memory_bytes: memory per rank, overriding the preset's.
        profile: JSON written by `shardrec plan calibrate`; its measured figures win.
    """
    if preset not in PRESETS:
        raise ValueError(f"topology preset {preset!r} is not one of {', '.join(PRESETS)}")
    values = dict(PRESETS[preset])
    if profile is not None:
        values.update(load_profile(profile))
    preset_lws = values.pop("local_world_size") or world_size
    # A preset's host size shrinks to fit a small job; a size the user gives is checked as is.
    lws = local_world_size or min(preset_lws, world_size)
    if memory_bytes is not None:
        values["memory_bytes"] = memory_bytes
    return ClusterTopology(name=preset, world_size=world_size, local_world_size=lws, **values)


PROFILE_KEYS = ("intra_host_bw", "inter_host_bw", "lookup_bw", "collective_latency_s", "bwd_compute_multiplier")


def load_profile(path: str | Path) -> dict[str, float]:
    """The measured figures of a calibration profile; ValueError naming the file on bad input."""
    path = Path(path)
    raw = read_strict_json(path, "calibration profile")  # NaN and Infinity refused, naming the key
    measured = raw.get("measured") if isinstance(raw, dict) else None
    if not isinstance(measured, dict):
        raise ValueError(f"{path}: no 'measured' section (write one with `shardrec plan calibrate`)")
    out = {}
    for key, value in measured.items():
        if key not in PROFILE_KEYS:
            continue
        if expect(path, value, "number", f"measured.{key}") <= 0:  # a number: not true, not "1e9"
            raise ValueError(f"{path}: measured.{key} = {value!r} must be a positive number")
        out[key] = float(value)
    return out
