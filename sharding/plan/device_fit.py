"""The check at start that a plan's estimate fits each rank's device: refused before sharding, in
one line naming every short rank, its device, its need and the gap."""

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
