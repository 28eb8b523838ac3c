"""`shardrec bench hitrate`: predicted UVM cache hit rates against exact caches replaying the
data."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardrec.tools.cli.bench.options import JsonFlag, show, stops_in_one_line
from shardrec.tools.cli.common import fail


def hitrate(
    data: Annotated[Path, typer.Option(help="Dataset directory (its train split is replayed).")],
    config: Annotated[
        Path | None,
        typer.Option(
            help="Job file: batch, shuffle, multi-hot, model widths, sharding constraints."
        ),
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", metavar="KEY=VALUE", help="Override a job setting.")
    ] = None,
    plan: Annotated[
        Path | None, typer.Option(help="A plan with cached tables (default: plan past HBM here).")
    ] = None,
    world_size: Annotated[int, typer.Option(min=1, help="Ranks to plan for (without --plan).")] = 8,
    hbm_share: Annotated[
        float, typer.Option(help="Share of the tables the ranks' HBM holds (without --plan).")
    ] = 0.3,
    batches: Annotated[
        int, typer.Option(min=0, help="Global batches to replay (0: one epoch).")
    ] = 0,
    json_out: JsonFlag = False,
) -> None:
    """Predicted UVM cache hit rates against exact LRU and LFU caches replaying the data's id
    stream."""
    from shardrec.tools.bench.plan import hitrate_bench as bench_hitrate

    try:
        result = bench_hitrate.run_hitrate(
            data, config, set_ or [], plan, world_size, hbm_share, batches
        )
    except ValueError as e:
        fail(str(e))
    show(result, json_out, bench_hitrate.print_result)


def register(bench_app: typer.Typer) -> None:
    bench_app.command("hitrate")(stops_in_one_line(hitrate))
