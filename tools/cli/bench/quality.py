"""`shardrec bench quality`: managed tables against hashing and an unbounded vocabulary on a
drifting log."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardrec.tools.cli.bench.options import JsonFlag, show, stops_in_one_line
from shardrec.tools.cli.common import fail


def quality(
    days: Annotated[int, typer.Option(min=2, help="Days of the drifting log.")] = 6,
    rows_per_day: Annotated[
        int,
        typer.Option(
            help="Rows of each day (>= 1,500: fewer leave no table with the 1,000 distinct ids "
            "of a raw-id table, the tables the arms differ in)."
        ),
    ] = 60_000,
    seeds: Annotated[
        str,
        typer.Option(
            help="Model seeds, comma-separated: one run per arm and seed (the goal against the "
            "seeds' spread needs >= 2)."
        ),
    ] = "1,2,3",
    max_vocab: Annotated[
        int, typer.Option(min=4, help="Largest initial population of a table (synth's).")
    ] = 100_000,
    batch: Annotated[int, typer.Option(min=2, help="Global batch size.")] = 512,
    nproc: Annotated[
        int, typer.Option("--nproc-per-node", min=1, help="CPU ranks of every run.")
    ] = 2,
    work: Annotated[
        Path | None,
        typer.Option(
            help="Keep the data and runs here: a rerun reuses the days made of the same log and "
            "the runs trained on them with the same settings, and trains the others anew; "
            "default: a temp dir."
        ),
    ] = None,
    managed: Annotated[
        str | None,
        typer.Option(
            help="The managed arm's settings beside kind and rows, as the items of a tables.X "
            'inline table, e.g. \'policy="lru", max_age="1 days"\' ("": a table\'s defaults); '
            "default: 'policy=\"lfu\", decay=3'."
        ),
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Managed tables (1/4 of the distinct ids) vs hashing into the same rows vs an unbounded
    vocabulary, on a drifting log trained day by day with progressive validation."""
    from shardrec.tools.bench.train.quality_bench import (
        MIN_DISTINCT,
        MIN_ROWS_PER_DAY,
        run_quality,
    )
    from shardrec.tools.bench.train.quality_report import print_quality

    if rows_per_day < MIN_ROWS_PER_DAY:
        fail(
            f"--rows-per-day {rows_per_day}: bench quality needs >= {MIN_ROWS_PER_DAY:,} rows a "
            f"day, for tables of {MIN_DISTINCT:,} distinct ids (raw-id tables, the ones the "
            "arms differ in)"
        )
    try:
        chosen = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        fail(f"--seeds {seeds!r}: expected integers separated by commas")
    if not chosen:
        fail("--seeds: give at least one")
    try:
        settings = {} if managed is None else {"managed": managed}
        result = run_quality(work, days, rows_per_day, chosen, nproc, batch, max_vocab, **settings)
    except (ValueError, RuntimeError) as e:
        fail(str(e))
    show(result, json_out, print_quality)


def register(bench_app: typer.Typer) -> None:
    bench_app.command("quality")(stops_in_one_line(quality))
