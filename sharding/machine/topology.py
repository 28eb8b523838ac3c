"""The machines a plan is made for: ranks, hosts, memory and bandwidths, with presets.

Bandwidths are bytes per second as one rank sees them: `intra_host_bw` to a rank on the
same host, `inter_host_bw` to a rank on another host, `lookup_bw` for reading embedding
rows from the device's memory. A calibration profile (`shardrec plan calibrate`) replaces
the preset's figures with ones measured on this machine.

Memory is what one rank's device holds (a GPU's memory as the card reports it, not its
marketing size; on CPU, host memory per rank), of which the planner fills at most
`1 - reserve_fraction`: torchrec's planner keeps 15% free by default for what no estimate
sees (allocator fragmentation, the CUDA context, library workspaces), and so does shardrec.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardrec.sharding.machine.json_checks import expect, need, read_strict_json
from shardrec.sharding.machine.memory import MEMORY_MODELS, MODEL_KEYS, MemoryModel

GiB = 1024**3


LATER_FIELDS = (
    "host_link_bw",
    "reserve_fraction",
    "host_memory_bytes",
    "memory_source",
    "memory_model",
    "cost_model",
)
"""ClusterTopology fields newer than the first plan files (see to_dict)."""


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
    """Memory of one rank's device (CPU: host memory per rank); the plan fills `usable_bytes` of
    it."""
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
    host_link_bw: float = 32e9
    """Bytes/s between host memory and the device (PCIe): UVM caches' fetches (torchrec's
    figure)."""
    reserve_fraction: float = 0.15
    """Share of `memory_bytes` the plan leaves free (torchrec's default heuristical reservation)."""
    host_memory_bytes: int = 0
    """CUDA: host memory per rank that UVM tables may use (0: none; CPU topologies: unused)."""
    memory_source: str = "preset"
    """Where memory_bytes came from: preset, user (--memory-gib) or device (free memory at plan
    time)."""
    memory_model: MemoryModel | None = None
    """Constants of the memory estimate (memory.py); None: the device kind's defaults."""
    cost_model: str = ""
    """The step-time model the search optimises: shardrec or torchrec (whichever `bench
    plan-reality` found to predict measured step times better on this machine); "": the device
    kind's default."""

    def __post_init__(self) -> None:
        if self.world_size <= 0:
            raise ValueError(f"topology world_size = {self.world_size} must be > 0")
        if self.local_world_size <= 0 or self.world_size % self.local_world_size:
            raise ValueError(
                f"topology local_world_size = {self.local_world_size} must be > 0 "
                f"and divide world_size = {self.world_size}"
            )
        if self.cost_model not in ("", *COST_MODELS):
            raise ValueError(
                f"topology {self.name}: cost model {self.cost_model!r} is not one of shardrec, torchrec"
            )
        if self.device_kind not in MEMORY_MODELS:
            raise ValueError(
                f"topology {self.name}: device kind {self.device_kind!r} is not one of cpu, cuda"
            )
        if self.memory_bytes <= 0:
            raise ValueError(
                f"topology {self.name}: memory per rank is {self.memory_bytes} bytes; it must be > 0"
            )
        if not 0 <= self.reserve_fraction < 1:
            raise ValueError(
                f"topology {self.name}: reserve_fraction = {self.reserve_fraction} must be in [0, 1)"
            )
        for key in ("intra_host_bw", "inter_host_bw", "lookup_bw"):
            if getattr(self, key) <= 0:
                raise ValueError(f"topology {self.name}: {key} = {getattr(self, key)} must be > 0")

    @property
    def memory(self) -> MemoryModel:
        return self.memory_model or MEMORY_MODELS[self.device_kind]

    @property
    def usable_bytes(self) -> int:
        """Memory per rank the plan may fill: the device's less the reserve."""
        return int(self.memory_bytes * (1 - self.reserve_fraction))

    @property
    def num_hosts(self) -> int:
        return self.world_size // self.local_world_size

    def host(self, rank: int) -> int:
        return rank // self.local_world_size

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        # Fields added after the first plan files are written only when they differ from their
        # default, so a plan file written before them reads and writes back byte for byte.
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for key in LATER_FIELDS:
            if getattr(self, key) == defaults[key]:
                del out[key]
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ClusterTopology:
        """The topology a plan file records (to_dict's output; older files lack the newer
        fields)."""
        memory = raw.get("memory_model")
        return cls(**{**raw, "memory_model": MemoryModel(**memory) if memory else None})


# Per-rank figures. GPU presets: HBM as torch.cuda.mem_get_info reports it for one device
# (an "80 GB" card shows ~79 GiB, an H200's "141 GB" ~139 GiB) and its bandwidth, NVLink bus
# bandwidth per direction, one 200/400 Gb/s NIC per GPU for the network, and host memory per
# GPU for UVM tables (a 2 TiB host of 8 GPUs, a quarter kept for the OS and the loaders).
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
        memory_bytes=79 * GiB,
        host_memory_bytes=192 * GiB,
        intra_host_bw=240e9,
        inter_host_bw=25e9,
        lookup_bw=1.6e12,
        host_link_bw=25e9,
    ),
    "h100": dict(
        device_kind="cuda",
        local_world_size=8,
        memory_bytes=79 * GiB,
        host_memory_bytes=192 * GiB,
        intra_host_bw=360e9,
        inter_host_bw=50e9,
        lookup_bw=2.7e12,
        host_link_bw=50e9,
    ),
    "h200": dict(
        device_kind="cuda",
        local_world_size=8,
        memory_bytes=139 * GiB,
        host_memory_bytes=192 * GiB,
        intra_host_bw=360e9,
        inter_host_bw=50e9,
        lookup_bw=3.8e12,
        host_link_bw=50e9,
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
        loaded = load_profile(profile, device_kind=values["device_kind"], preset=preset)
        memory = loaded.pop("memory_model", None)
        values.update(loaded)
        if memory:
            values["memory_model"] = dataclasses.replace(
                MEMORY_MODELS[values["device_kind"]], **memory
            )
    preset_lws = values.pop("local_world_size") or world_size
    # A preset's host size shrinks to fit a small job; a size the user gives is checked as is.
    lws = local_world_size or min(preset_lws, world_size)
    if memory_bytes is not None:
        values["memory_bytes"] = memory_bytes
        values["memory_source"] = "user"
    return ClusterTopology(name=preset, world_size=world_size, local_world_size=lws, **values)


PROFILE_KEYS = (
    "intra_host_bw",
    "inter_host_bw",
    "lookup_bw",
    "collective_latency_s",
    "bwd_compute_multiplier",
)
COST_MODELS = ("shardrec", "torchrec")


def load_profile(
    path: str | Path, device_kind: str | None = None, preset: str = ""
) -> dict[str, Any]:
    """What a calibration profile sets, as ClusterTopology fields: the measured figures
    (PROFILE_KEYS), the better `cost_model` and the `memory_model` constants (a dict) where
    `bench plan-reality --profile-out` wrote them. ValueError naming the file on bad input, or on a
    profile measured on other devices than `device_kind` (those of topology `preset`)."""
    path = Path(path)
    raw = read_strict_json(path, "calibration profile")  # NaN and Infinity refused, naming the key
    measured_on = raw.get("device_kind") if isinstance(raw, dict) else None
    if device_kind is not None and measured_on is not None and measured_on != device_kind:
        # A CPU's lookup and all-to-all figures would price a GPU's plan (and its search).
        raise ValueError(
            f"{path}: measured on {measured_on} devices, and the {preset} topology is of "
            f"{device_kind} devices: measure those (`shardrec plan calibrate --device "
            f"{device_kind}` on their machine) or plan without --profile"
        )
    measured = raw.get("measured") if isinstance(raw, dict) else None
    if not isinstance(measured, dict):
        raise ValueError(
            f"{path}: no 'measured' section (write one with `shardrec plan calibrate`)"
        )
    out: dict[str, Any] = {}
    for key, value in measured.items():
        if key not in PROFILE_KEYS:
            continue
        if expect(path, value, "number", f"measured.{key}") <= 0:  # a number: not true, not "1e9"
            raise ValueError(f"{path}: measured.{key} = {value!r} must be a positive number")
        out[key] = float(value)
    if "cost_model" in raw:
        winner = need(
            path,
            expect(path, raw["cost_model"], "object", "cost_model"),
            "winner",
            "str",
            "cost_model.",
        )
        if winner not in COST_MODELS:
            raise ValueError(
                f"{path}: cost_model.winner = {winner!r} is not one of {', '.join(COST_MODELS)}"
            )
        out["cost_model"] = winner
    if "memory" in raw:
        memory = expect(path, raw["memory"], "object", "memory")
        out["memory_model"] = {}
        for key, value in memory.items():
            if key in MODEL_KEYS:
                if expect(path, value, "number", f"memory.{key}") < 0:
                    raise ValueError(f"{path}: memory.{key} = {value!r} must not be negative")
                out["memory_model"][key] = float(value)
    return out
