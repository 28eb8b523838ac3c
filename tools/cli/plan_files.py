"""`shardrec plan calibrate` and `shardrec plan show`: the files `shardrec plan` reads and
writes besides planning, a calibration profile measured on this machine and a saved plan's
report (plan.py registers them under `plan`)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from shardrec.tools.cli.common import check_out_file, counted, fail, print_json, write_out
from shardrec.tools.console import console


def calibrate_cmd(
    out: Annotated[
        Path, typer.Option(help="Profile to write (read by `shardrec plan --profile`).")
    ] = Path("calibration.json"),
    world_size: Annotated[
        int, typer.Option(help="Local processes for the collective measurement.")
    ] = 2,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    json_out: Annotated[bool, typer.Option("--json", help="Print the profile as JSON.")] = False,
) -> None:
    """Measure this machine's embedding lookup bandwidth and collective bandwidth/latency."""
    import torch

    from shardrec.tools.measure.calibrate import calibrate, save_profile

    if device not in ("cpu", "cuda"):
        fail(f"--device must be cpu or cuda, got {device!r}")
    check_out_file(out, "calibration.json")
    if device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: CUDA is not available on this machine")
    if world_size < 2:
        fail(f"--world-size must be at least 2 to measure collectives, got {world_size}")
    if device == "cuda" and world_size > torch.cuda.device_count():
        fail(f"--world-size {world_size}: only {torch.cuda.device_count()} CUDA device(s)")
    with (
        console.status("measuring lookups and collectives", spinner="dots")
        if not json_out
        else contextlib.nullcontext()
    ):
        profile = calibrate(device, world_size)
    write_out(out, "profile", lambda: save_profile(profile, out))
    if json_out:
        print_json(profile)
        return
    m = profile["measured"]
    console.print(
        f"lookup: {m['lookup_bw'] / 1e9:.2f} GB/s read, backward+update {m['bwd_compute_multiplier']:.2f}x forward"
    )
    console.print(
        f"all-to-all: {m['intra_host_bw'] / 1e9:.2f} GB/s per rank, start-up {m['collective_latency_s'] * 1e6:.0f} us"
    )
    console.print(f"wrote {out}; use it with `shardrec plan --profile {out}`")


def show_cmd(
    plan_file: Annotated[
        Path,
        typer.Argument(help="Plan file written by `shardrec plan --out` (or a run's plan.json)."),
    ],
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the plan summary and per-rank estimate as JSON.")
    ] = False,
) -> None:
    """Reprint a saved plan file's report: the tables, the ranks and the estimate."""
    from shardrec.sharding.plan.plan_file import load_plan
    from shardrec.sharding.plan.plan_layout import check_layout
    from shardrec.sharding.plan.report import placements, ranks_table, summary, tables_table

    if not plan_file.exists():
        fail(f"{plan_file}: does not exist")
    try:
        result = load_plan(plan_file)
    except ValueError as e:
        fail(str(e))
    try:  # what `shardrec train` refuses is not shown as a plan (its own tables, rows and ranks)
        check_layout(result, result.fingerprint.tables, result.fingerprint.world_size)
    except ValueError as e:
        fail(f"{plan_file}: {e}")
    if json_out:
        print_json({**summary(result), **placements(result)})
        return
    console.print(tables_table(result))
    console.print(ranks_table(result))
    fp = result.fingerprint
    console.print(
        f"{plan_file}: {len(result.tables)} tables for {counted(fp.world_size, 'rank')}, global batch "
        f"{fp.global_batch_size:,}, planner {result.planner}",
        highlight=False,
    )
