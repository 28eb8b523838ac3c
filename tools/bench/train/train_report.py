"""What `shardrec bench train` prints: the rates and ratios against stock torchrec, those against
the DLRM reference (--reference), and where a step's time goes (--breakdown)."""

from __future__ import annotations

from typing import Any

from shardrec.tools.bench.rounds import Run, load_average, ratio, ratio_text, summarize
from shardrec.tools.console import console

AUC_TOLERANCE = 0.002
REFERENCE_GOALS = {"ours_fp32": 1.5, "ours_bf16": 2.0}
"""The issue's goals against the reference: fp32 >= 1.5x; bf16 (where native) >= 2x."""


def print_result(result: dict[str, Any]) -> None:
    console.print(
        f"{result['ranks']} {result['device'].upper()} ranks x {result['threads_per_rank']} "
        f"thread(s), {result['model']} DLRM, {result['samples_per_rank']} samples per rank, "
        f"{result['rounds']} interleaved rounds x {result['steps']} steps after a warm-up "
        f"(load average {result['load_average'][0]}); ours' dense layers "
        f"{'compiled' if result['ours_compiled'] else 'eager'}",
        highlight=False,
    )
    for name, rate in result["median_samples_per_s"].items():
        console.print(
            f"  {name:20s} {rate:>10,.0f} samples/s  {result['samples_per_cpu_s'][name]:>10,.0f} "
            f"samples/CPU-s",
            highlight=False,
        )
    # bf16 is held against ours fp32 (the same code in another precision), not stock torchrec.
    auc = result["val_auc"]
    bf16, fp32 = f"its val AUC {auc['ours_bf16']:.4f}", f"ours fp32's {auc['ours_fp32']:.4f}"
    verdict = (
        f"counts: {bf16} is within {AUC_TOLERANCE} of {fp32}"
        if result["bf16_auc_within_tolerance"]
        else f"does NOT count: {bf16} differs from {fp32} by more than {AUC_TOLERANCE}"
    )
    lines = [
        ("ours fp32 / stock torchrec fp32", "ours_fp32_vs_stock_fp32", "(target >= 1.0)"),
        (
            "ours bf16 / stock torchrec fp32",
            "ours_bf16_vs_stock_fp32",
            f"(target >= 1.5); {verdict}",
        ),
        ("real loader / in-memory batches", "loader_vs_in_memory", "(target >= 0.97)"),
    ]
    for label, key, tail in lines:
        console.print(f"{label}: {ratio_text(result[key])} {tail}", highlight=False)
    console.print(
        f"val AUC after the same steps: stock fp32 {auc['stock_fp32']:.4f}, ours fp32 "
        f"{auc['ours_fp32']:.4f}, ours bf16 {auc['ours_bf16']:.4f}",
        highlight=False,
    )
    console.print(
        f"sharding types: stock {', '.join(result['sharding_types']['stock'])}; "
        f"ours {', '.join(result['sharding_types']['ours'])}",
        highlight=False,
    )
    if "breakdown" in result:
        print_breakdown(result["breakdown"])


def print_breakdown(sides: dict[str, dict[str, float]]) -> None:
    """Milliseconds per step by category, one column per side, each with its share of the step."""
    from rich.table import Table

    names = list(sides)
    keys = ["step wall"] + sorted(
        {k for s in sides.values() for k in s if k != "step wall"},
        key=lambda k: -max(s.get(k, 0.0) for s in sides.values()),
    )
    table = Table(
        title="where a step's time goes, ms per step (mean over ranks; profiled steps)",
        title_justify="left",
    )
    table.add_column("category")
    for name in names:
        table.add_column(name.replace("_", " "), justify="right")
    for key in keys:
        cells = []
        for name in names:
            ms, wall = sides[name].get(key, 0.0), sides[name].get("step wall", 0.0) or 1.0
            cells.append(f"{ms:.1f}" if key == "step wall" else f"{ms:.1f} ({ms / wall:.0%})")
        table.add_row(key, *cells)
    console.print(table)


def summarise_reference(
    raw: dict[str, Any], model: str, nproc: int, threads: int, steps: int, rounds: int
) -> dict[str, Any]:
    """Ours against the DLRM reference: rates, ratios (medians of same-round ratios), AUCs."""
    from shardrec.tools.bench.train.train_bench import MIN_RUN_S, too_small

    runs: dict[str, list[Run]] = raw["runs"]
    summaries = {k: summarize(v) for k, v in runs.items()}
    auc = raw["auc"]
    ratios = {
        f"{name}_vs_reference": ratio(
            runs[name], runs["reference"], too_small=too_small(steps), min_run_s=MIN_RUN_S
        ).to_dict()
        for name in runs
        if name != "reference"
    }
    return {
        "baseline": "the DLRM reference (facebookresearch/dlrm torchrec_dlrm/dlrm_main.py)",
        "model": model,
        "ranks": nproc,
        "threads_per_rank": threads,
        "global_batch": raw["global_batch"],
        "steps": steps,
        "warmup_steps": raw["warmup"],
        "rounds": rounds,
        "load_average": load_average(),
        "median_samples_per_s": {k: round(v.rate, 1) for k, v in summaries.items()},
        "samples_per_cpu_s": {k: round(v.cpu_rate, 1) for k, v in summaries.items()},
        **ratios,
        "val_auc": {k: None if v is None else round(v, 4) for k, v in auc.items()},
        "auc_within_tolerance": {
            k: auc.get(k) is not None
            and auc.get("reference") is not None
            and abs(auc[k] - auc["reference"]) <= AUC_TOLERANCE
            for k in runs
            if k != "reference"
        },
        **({"breakdown": raw["breakdown"]} if raw.get("breakdown") else {}),
    }


def print_reference(result: dict[str, Any]) -> None:
    console.print(
        f"ours against {result['baseline']}: {result['ranks']} CPU ranks x "
        f"{result['threads_per_rank']} thread(s), {result['model']} DLRM, global batch "
        f"{result['global_batch']}, {result['rounds']} interleaved rounds (each side in its own "
        f"processes) x {result['steps']} timed steps after {result['warmup_steps']} "
        f"(load average {result['load_average'][0]})",
        highlight=False,
    )
    for name, rate in result["median_samples_per_s"].items():
        console.print(
            f"  {name:12s} {rate:>10,.0f} samples/s  {result['samples_per_cpu_s'][name]:>10,.0f} "
            f"samples/CPU-s  val AUC {result['val_auc'].get(name)}",
            highlight=False,
        )
    for name, goal in REFERENCE_GOALS.items():
        key = f"{name}_vs_reference"
        if key in result:
            same = (
                "same AUC within"
                if result["auc_within_tolerance"][name]
                else "AUC differs by more than"
            )
            console.print(
                f"{name.replace('_', ' ')} / reference: {ratio_text(result[key])} "
                f"(goal >= {goal}; {same} {AUC_TOLERANCE})",
                highlight=False,
            )
    if "breakdown" in result:
        print_breakdown(result["breakdown"])
