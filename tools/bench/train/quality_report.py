"""bench quality's report: the runs' progressive validation summarised per arm (mean PV AUC over
seeds, spread, per day), what it says of its two goals (managed above hashed by more than the
run-to-run spread, unbounded within GOAL_VS_UNBOUNDED of managed) and the lines it prints. The
runs themselves: quality_bench.py."""

from __future__ import annotations

from typing import Any

import numpy as np

from shardrec.tools.bench.train.quality_arms import ARMS, MANAGED, QualityData
from shardrec.tools.console import console

GOAL_VS_UNBOUNDED = 0.002
MIN_SEEDS_FOR_SPREAD = 2
"""Seeds a spread needs: with one, every arm's spread is 0 and "above the spread" says nothing."""


def summarise(
    runs, collisions, data: QualityData, rows_per_day: int, seeds, nproc, settings: str = MANAGED
) -> dict:
    per_run = {name: [s["pv"]["auc"] for s in stretches[1:]] for name, stretches in runs.items()}
    arms = {}
    for arm in ARMS:
        means = [float(np.mean(per_run[f"{arm}-seed{s}"])) for s in seeds]
        arms[arm] = {
            "mean_pv_auc": round(float(np.mean(means)), 5),
            "spread": round(max(means) - min(means), 5),
            "per_seed": [round(m, 5) for m in means],
            "per_day": [
                round(float(np.mean([per_run[f"{arm}-seed{s}"][d] for s in seeds])), 5)
                for d in range(len(data.days) - 1)
            ],
        }
    managed = [runs[f"managed-seed{s}"] for s in seeds]
    maps = [
        {
            k: float(np.mean([m[d]["id_maps"].get(k, 0) for m in managed]))
            for k in ("shared_row_share", "admitted", "evicted")
        }
        for d in range(len(data.days))
    ]
    spread = max(a["spread"] for a in arms.values())
    spread_measured = len(seeds) >= MIN_SEEDS_FOR_SPREAD
    vs_hashed = arms["managed"]["mean_pv_auc"] - arms["hashed"]["mean_pv_auc"]
    vs_unbounded = arms["unbounded"]["mean_pv_auc"] - arms["managed"]["mean_pv_auc"]
    return {
        "days": len(data.days),
        "rows_per_day": rows_per_day,
        "seeds": seeds,
        "ranks": nproc,
        "raw_tables": data.raw,
        "managed_settings": settings,
        "arms": arms,
        "managed_minus_hashed": round(vs_hashed, 5),
        "unbounded_minus_managed": round(vs_unbounded, 5),
        "largest_spread": round(spread, 5),
        # None: not measured (one seed has no spread to beat); print_quality says why.
        "managed_beats_hashed": vs_hashed > spread if spread_measured else None,
        # None: not decided (the goal lies within the spread of the gap); see near_unbounded.
        "managed_near_unbounded": near_unbounded(vs_unbounded, spread, spread_measured),
        "near_unbounded_judged": "spread" if spread_measured else "one seed",
        "hashed_collisions": collisions,
        "managed_maps_per_day": maps,
    }


def near_unbounded(gap: float, spread: float, spread_measured: bool) -> bool | None:
    """Whether unbounded - managed (`gap`, of the arms' means) is within GOAL_VS_UNBOUNDED, judged
    as managed - hashed is, against the run-to-run spread: met where the gap plus the largest
    spread is within the goal, NOT met where the gap less it is still above, None (not decided)
    where the goal lies within the spread of the gap. One seed has no spread: the gap alone."""
    if not spread_measured:
        return gap <= GOAL_VS_UNBOUNDED
    if gap + spread <= GOAL_VS_UNBOUNDED:
        return True
    return False if gap - spread > GOAL_VS_UNBOUNDED else None


def _near_unbounded_text(result: dict[str, Any]) -> str:
    """The goal's verdict and how it was judged: against the spread, or on one seed."""
    near, spread = result["managed_near_unbounded"], f"{result['largest_spread']:.4f}"
    if result["near_unbounded_judged"] == "one seed":
        return f"{'met' if near else 'NOT met'} on one seed, no spread to judge it against"
    if near is None:
        return f"not decided, the goal is within the largest spread, {spread}, of the gap"
    if near:
        return f"met, with the largest spread, {spread}, added"
    return f"NOT met, with the largest spread, {spread}, taken off"


def print_quality(result: dict[str, Any]) -> None:
    raw = result["raw_tables"]
    console.print(
        f"{result['days']} days x {result['rows_per_day']:,} rows of a drifting log; "
        f"{len(raw)} raw-id tables ({min(raw.values()):,}-{max(raw.values()):,} distinct ids), "
        f"budget 1/4 of them; {result['ranks']} ranks; model seeds {result['seeds']}; "
        "PV: each day evaluated before training on it"
    )
    console.print(f"managed: {result['managed_settings'] or 'the defaults'}")
    for arm, a in result["arms"].items():
        days = " ".join(f"{x:.4f}" for x in a["per_day"])
        console.print(
            f"  {arm:10s} mean PV AUC {a['mean_pv_auc']:.4f} (spread {a['spread']:.4f}); "
            f"by day: {days}"
        )
    beats = result["managed_beats_hashed"]
    if beats is None:
        vs_spread = f"not measured (needs >= {MIN_SEEDS_FOR_SPREAD} seeds)"
    else:
        vs_spread = f"{result['largest_spread']:.4f}: {'met' if beats else 'NOT met'}"
    console.print(
        f"managed - hashed: {result['managed_minus_hashed']:+.4f} (goal: above the largest spread"
        f"{': ' if beats is None else ', '}{vs_spread}); "
        f"unbounded - managed: {result['unbounded_minus_managed']:+.4f} (goal <= "
        f"{GOAL_VS_UNBOUNDED}: {_near_unbounded_text(result)})"
    )
    same = " ".join(f"{c['same_day']:.1%}" for c in result["hashed_collisions"])
    ever = " ".join(f"{c['any_day_so_far']:.1%}" for c in result["hashed_collisions"])
    console.print(f"hashing's collisions by day: with an id of the same day {same}; "
                  f"with an id of any day so far {ever}")  # fmt: skip
    shared = " ".join(f"{m['shared_row_share']:.1%}" for m in result["managed_maps_per_day"])
    console.print(f"managed: lookups on the shared row by day {shared}")
