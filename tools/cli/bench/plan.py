"""`shardrec bench plan`: the plan `shardrec plan` writes against torchrec's default planner's."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardrec.tools.bench.plan import plan_bench as bench_plan
from shardrec.tools.cli.bench.options import JsonFlag, show, stops_in_one_line
from shardrec.tools.cli.common import fail


def plan(
    only: Annotated[
        str | None, typer.Option(help="Run only the cases whose name contains this text.")
    ] = None,
    reserve: Annotated[
        float, typer.Option(help="Share of each rank's memory both planners keep free.")
    ] = bench_plan.RESERVE,
    profile: Annotated[
        Path | None,
        typer.Option(
            help="Calibration profile whose cost-model verdict (bench plan-reality) applies."
        ),
    ] = None,
    measure: Annotated[
        bool, typer.Option(help="Train both plans of the CPU cases on local ranks.")
    ] = True,
    json_out: JsonFlag = False,
) -> None:
    """The plan `shardrec plan` writes vs torchrec's default planner's, priced by the better
    predictor as --profile measured it, else by the default model (ratio < 1: shardrec faster),
    both keeping the same memory free; CPU cases trained too."""
    cases = [c for c in bench_plan.CASES if only is None or only in c.name]
    if not cases:
        fail(
            f"--only {only!r} matches no case (cases: {', '.join(c.name for c in bench_plan.CASES)})"
        )
    if not 0 <= reserve < 1:
        fail(f"--reserve must be in [0, 1) (got {reserve})")
    try:
        result = bench_plan.run_plan_bench(
            cases, reserve, profile, measure, show_progress=not json_out
        )
    except ValueError as e:
        fail(str(e))
    show(result, json_out, bench_plan.print_plan_table)


def register(bench_app: typer.Typer) -> None:
    bench_app.command("plan")(stops_in_one_line(plan))
