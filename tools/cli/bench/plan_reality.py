"""`shardrec bench plan-reality`: plans trained on local CPU ranks, against the cost models'
order and the memory estimates."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from shardrec.tools.cli.bench.options import (
    JsonFlag,
    at_least,
    refuse_unused,
    show,
    stops_in_one_line,
)
from shardrec.tools.cli.common import fail
from shardrec.tools.console import console


def plan_reality(
    ctx: typer.Context,
    world_size: Annotated[int, typer.Option(help="Local gloo ranks.")] = 2,
    max_rows: Annotated[
        int, typer.Option(help="Rows per table, at most (the demo caps ids at 50,000).")
    ] = 50_000,
    large: Annotated[
        bool,
        typer.Option(
            "--large",
            help="Tables of up to 3,000,000 rows x 32 (2.3 GiB): >= 1 GiB per rank on 2 ranks.",
        ),
    ] = False,
    dim: Annotated[int, typer.Option(help="Embedding width.")] = 16,
    tables: Annotated[
        int, typer.Option(help="Tables (Criteo's first N cardinalities, capped).")
    ] = 26,
    global_batch_size: Annotated[int, typer.Option(help="Samples per step over all ranks.")] = 2048,
    steps: Annotated[int, typer.Option(help="Timed steps per plan.")] = 8,
    rounds: Annotated[
        int, typer.Option(help="Runs of every plan; the lowest time and peak count.")
    ] = 2,
    profile: Annotated[
        Path | None,
        typer.Option(help="Use this calibration profile's figures instead of calibrating now."),
    ] = None,
    profile_out: Annotated[
        Path | None,
        typer.Option(
            help="Write a calibration profile with the better cost model and memory figure."
        ),
    ] = None,
    memory_limit_gib: Annotated[
        float,
        typer.Option(
            help="Run only plans whose estimate for all ranks is below this (0: 80% of available)."
        ),
    ] = 0.0,
    managed: Annotated[
        int,
        typer.Option(
            min=0,
            help="Make the N largest tables managed tables of their rows: their id maps, on every "
            "rank, in the estimates and the measurement (new ids every step: the maps' worst case).",
        ),
    ] = 0,
    json_out: JsonFlag = False,
) -> None:
    """Train 12+ plans (both planners', simple and bad ones) on local CPU ranks: which cost model
    orders them like the clock (Kendall tau, median error), and how close is each rank's memory
    estimate to its peak?"""
    from shardrec.tools.bench.plan import reality_bench as bench_reality

    _check_options(world_size, global_batch_size, steps, rounds, tables, max_rows, dim)
    if not 0 <= memory_limit_gib < math.inf:
        fail(
            f"--memory-limit-gib {memory_limit_gib:g}: must be a finite number >= 0 "
            "(0: 80% of available)"
        )
    if large:  # its tables' rows and width are fixed
        refuse_unused(ctx, ("max_rows", "dim"), "with --large")
    try:
        result = bench_reality.run_reality(
            world_size=world_size,
            max_rows=bench_reality.LARGE_ROWS if large else max_rows,
            dim=bench_reality.LARGE_DIM if large else dim,
            num_tables=tables,
            global_batch_size=global_batch_size,
            steps=steps,
            rounds=rounds,
            profile=profile,
            memory_limit_bytes=memory_limit_gib * bench_reality.GiB,
            managed_tables=managed,
        )
    except ValueError as e:
        fail(str(e))
    if profile_out is not None:
        bench_reality.write_profile(result, profile_out)
    show(result, json_out, bench_reality.print_reality)
    if profile_out is not None and not json_out:
        console.print(f"wrote {profile_out}; use it with `shardrec plan --profile {profile_out}`")


def _check_options(
    world_size: int, batch: int, steps: int, rounds: int, tables: int, max_rows: int, dim: int
) -> None:
    """One line naming the first bad count."""
    at_least("--world-size", world_size, 2)
    at_least("--global-batch-size", batch, world_size, "a sample per rank of --world-size")
    if batch % world_size:
        fail(
            f"--global-batch-size {batch}: must be a multiple of --world-size ({world_size}), "
            f"e.g. {batch // world_size * world_size}"
        )
    for option, value in (
        ("--steps", steps),
        ("--rounds", rounds),
        ("--tables", tables),
        ("--max-rows", max_rows),
        ("--dim", dim),
    ):
        at_least(option, value, 1)


def register(bench_app: typer.Typer) -> None:
    bench_app.command("plan-reality")(stops_in_one_line(plan_reality))
