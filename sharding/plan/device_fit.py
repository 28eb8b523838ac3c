"""The checks at start that a plan's estimate fits each rank's device and each host's memory:
refused before sharding, in one line naming every short rank (or host), its need and the gap.

Host memory matters for UVM tables (fused_uvm, fused_uvm_caching): their weights are CUDA managed
memory on the host, and managed memory asked beyond what the host has can hang the GPU, not only
the process, so a plan whose host tier exceeds the host's available memory never starts."""

from __future__ import annotations

from shardrec.sharding.plan.plan_types import PlanDoesNotFitError, PlanFile
from shardrec.sharding.plan.report import fmt_bytes


def device_memory_gaps(plan: PlanFile, free_bytes: list[int]) -> list[tuple[int, int, int]]:
    """(rank, estimated bytes, free bytes) of every rank whose device has less free memory than
    the plan's estimate for it; `free_bytes[r]` is rank r's device's free memory now."""
    gaps = []
    for entry in plan.estimate.ranks if plan.estimate is not None else []:
        rank, need = entry.rank, entry.memory_bytes
        if rank < len(free_bytes) and need > free_bytes[rank]:
            gaps.append((rank, need, int(free_bytes[rank])))
    return gaps


def check_plan_fits_devices(
    plan: PlanFile,
    free_bytes: list[int],
    device_kind: str = "cuda",
    device_names: list[str] | None = None,
) -> None:
    """Refuse, before sharding, a plan whose estimate exceeds a rank's free device memory.

    Args:
        free_bytes: per rank, its device's free memory (CUDA: cuda_device_memory on each rank,
            gathered; CPU: available host memory over local ranks).
        device_names: per rank, its device as the message names it (e.g. "cuda:1, NVIDIA H200").
    Raises:
        PlanDoesNotFitError naming every short rank, its device, its need and the gap, in one line.
    """
    gaps = device_memory_gaps(plan, free_bytes)
    if not gaps:
        return
    tier = "HBM" if device_kind == "cuda" else "memory"
    names = [f" ({name})" for name in device_names] if device_names else [""] * len(free_bytes)
    parts = [
        f"rank {rank}{names[rank]} needs {fmt_bytes(need)} of {tier} by the plan's estimate, "
        f"its device has {fmt_bytes(free)} free: {fmt_bytes(need - free)} short"
        for rank, need, free in gaps[:8]
    ]
    more = f" and {len(gaps) - 8} more ranks" if len(gaps) > 8 else ""
    fix = "free the devices' memory, or re-plan for them on this machine with `shardrec plan --topology auto`"
    if device_kind == "cuda":
        fix += ", which keeps the tables that do not fit in host memory behind UVM caches"
    raise PlanDoesNotFitError(
        "the plan does not fit the devices: " + "; ".join(parts) + more + f" ({fix})"
    )


def host_memory_gaps(
    plan: PlanFile, host_available: list[int], local_world_size: int
) -> list[tuple[int, list[int], int, int]]:
    """(host, its ranks, UVM bytes the plan keeps there, available bytes) of every host whose
    ranks' host tier (the estimate's host_bytes) exceeds its available memory; `host_available[r]`
    is rank r's host's available memory (0: unknown, not checked)."""
    need: dict[int, tuple[list[int], int]] = {}
    for entry in plan.estimate.ranks if plan.estimate is not None else []:
        if entry.host_bytes <= 0 or entry.rank >= len(host_available):
            continue
        host = entry.rank // max(1, local_world_size)
        ranks, total = need.get(host, ([], 0))
        need[host] = ([*ranks, entry.rank], total + int(entry.host_bytes))
    gaps = []
    for host, (ranks, total) in sorted(need.items()):
        known = [host_available[r] for r in ranks if host_available[r] > 0]
        if known and total > min(known):
            gaps.append((host, ranks, total, min(known)))
    return gaps


def check_plan_fits_host(plan: PlanFile, host_available: list[int], local_world_size: int) -> None:
    """Refuse, before sharding, a plan whose UVM tables need more of a host's memory than it has
    available (host_memory_gaps); PlanDoesNotFitError in one line naming every short host."""
    gaps = host_memory_gaps(plan, host_available, local_world_size)
    if not gaps:
        return
    parts = [
        f"host {host} (rank{'s' if len(ranks) > 1 else ''} {_span(ranks)}) would keep "
        f"{fmt_bytes(need)} of UVM tables in its memory by the plan's estimate, it has "
        f"{fmt_bytes(have)} available: {fmt_bytes(need - have)} short"
        for host, ranks, need, have in gaps[:8]
    ]
    more = f" and {len(gaps) - 8} more hosts" if len(gaps) > 8 else ""
    raise PlanDoesNotFitError(
        "the plan does not fit host memory: " + "; ".join(parts) + more + " (managed memory "
        "beyond the host's can hang the GPU; free host memory, or re-plan on this machine with "
        "`shardrec plan --topology auto`, which plans UVM tables for its available memory)"
    )


def _span(ranks: list[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])
