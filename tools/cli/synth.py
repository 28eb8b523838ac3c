"""`shardrec synth`: write synthetic click logs in Criteo's text format."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from shardrec.tools.cli.common import fail, print_json
from shardrec.tools.console import console
from shardrec.tools.synth.criteo import write_dataset


def synth(
    out: Annotated[Path, typer.Argument(help="Directory to write the text files into.")],
    rows: Annotated[int, typer.Option(help="Total rows to write.")] = 100_000,
    seed: Annotated[int, typer.Option(help="Seed of the hidden model and of the rows.")] = 0,
    days: Annotated[
        int, typer.Option(help="0: one Kaggle-style train.txt; N: 1TB-style day_0 .. day_{N-1}.")
    ] = 0,
    csv: Annotated[
        bool,
        typer.Option("--csv", help="Comma-separated with a header, integers written as '260.0'."),
    ] = False,
    gz: Annotated[bool, typer.Option("--gz", help="gzip each file.")] = False,
    max_vocab: Annotated[
        int, typer.Option(help="Largest number of distinct values of one categorical.")
    ] = 100_000,
    like: Annotated[
        str,
        typer.Option(
            help="criteo (TSV, or --csv), avazu (train.csv: Avazu's 24 columns) or movielens (train.csv: "
            "MovieLens-1M's ratings joined with users and movies: quoted titles, genre lists, 1-5 ratings)."
        ),
    ] = "criteo",
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Write synthetic click logs whose labels follow a hidden model of the features: Criteo's
    format, or Avazu's or MovieLens-1M's shape (--like) for trying a feature spec."""
    if rows <= 0:
        fail(f"--rows must be positive, got {rows}")
    if max_vocab < 4:
        fail(f"--max-vocab must be at least 4, got {max_vocab}")
    if out.exists() and not out.is_dir():
        fail(f"{out}: exists and is not a directory")
    from shardrec.tools.synth.avazu_movielens import LIKE, write_like

    if like not in LIKE:
        fail(f"--like {like!r} is not one of {', '.join(LIKE)}")
    if like != "criteo" and (days or csv):
        fail(f"--like {like} writes one CSV file: --days and --csv are for criteo")
    start = time.perf_counter()
    if like == "criteo":
        paths = write_dataset(out, rows, seed, days=days, csv=csv, gz=gz, max_vocab=max_vocab)
    else:
        paths = [out / f"train.csv{'.gz' if gz else ''}"]
        write_like(paths[0], like, rows, seed)
    seconds = time.perf_counter() - start
    result = {"files": [str(p) for p in paths], "rows": rows, "seconds": round(seconds, 3)}
    if json_out:
        print_json(result)
    else:
        console.print(f"wrote {rows:,} rows to {len(paths)} file(s) in {out} ({seconds:.1f} s)")


def register(app: typer.Typer) -> None:
    app.command()(synth)
