"""`shardrec bench sequence`: held-out AUC of HSTU against a DLRM pooling the same history."""

from __future__ import annotations

from typing import Annotated

import typer

from shardrec.tools.cli.bench.options import JsonFlag, at_least, show, stops_in_one_line
from shardrec.tools.cli.common import fail


def sequence(
    rows: Annotated[
        int, typer.Option(help="Listens of the synthetic Yambda-like log both models train on.")
    ] = 200_000,
    seeds: Annotated[int, typer.Option(help="Runs of each model, one seed each.")] = 3,
    steps: Annotated[int, typer.Option(help="Steps of each run (0: one epoch).")] = 0,
    nproc: Annotated[
        int, typer.Option("--nproc-per-node", min=1, help="CPU ranks of each run.")
    ] = 2,
    json_out: JsonFlag = False,
) -> None:
    """Held-out AUC of HSTU (configs/dlrmv4.toml) against a DLRM that pools the same history, on a
    synthetic log whose label depends on the order of each user's events; several seeds each."""
    from shardrec.tools.bench.sequence import sequence_quality

    at_least("--rows", rows, 1000)
    at_least("--seeds", seeds, 2, "the AUCs' spread needs two runs of each model")
    at_least("--steps", steps, 0, "0: one epoch")
    try:
        result = sequence_quality.run_quality(rows, seeds, steps, nproc)
    except (ValueError, RuntimeError) as e:
        fail(str(e))
    show(result, json_out, sequence_quality.print_result)


def register(bench_app: typer.Typer) -> None:
    bench_app.command("sequence")(stops_in_one_line(sequence))
