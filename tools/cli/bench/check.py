"""`shardrec bench check`: the quick benchmarks against the floors recorded for this machine
class."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardrec.tools.bench import check as bench_check
from shardrec.tools.cli.bench.options import JsonFlag, show, stops_in_one_line
from shardrec.tools.cli.common import fail
from shardrec.tools.console import console


def check(
    only: Annotated[
        str | None,
        typer.Option(
            help="Run only the benchmarks whose name contains this (loader, preprocess, train)."
        ),
    ] = None,
    record: Annotated[
        bool,
        typer.Option(
            "--record", help="Write this run's medians as the floors of this machine's class."
        ),
    ] = False,
    note: Annotated[
        str, typer.Option(help="With --record: a note kept beside the floors (provisional, why).")
    ] = "",
    floors: Annotated[Path, typer.Option(help="The floors file.")] = bench_check.FLOORS,
    json_out: JsonFlag = False,
) -> None:
    """The quick benchmarks, each ratio against the floor recorded for this machine class (make
    bench-check); exit 1 when one is below its floor, too small to measure or has no floor."""
    if note and not record:
        fail(f"--note {note!r} is kept beside recorded floors: give it with --record")
    try:
        result = bench_check.run_check(only, floors, recording=record)
    except (ValueError, RuntimeError) as e:
        fail(str(e))
    if record:
        bench_check.record(result, floors, note)
    show(result, json_out, bench_check.print_check)
    if record and not json_out:
        console.print(f"recorded the floors of {result['machine_class']} in {floors}")
    if not record and bench_check.failed(result):
        raise typer.Exit(1)


def register(bench_app: typer.Typer) -> None:
    bench_app.command("check")(stops_in_one_line(check))
