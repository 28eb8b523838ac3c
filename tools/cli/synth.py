"""`shardrec synth`: write synthetic click logs in Criteo's text format."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from shardrec.tools.cli.common import fail, interrupted, print_json, sigterm_as_ctrl_c
from shardrec.tools.console import console
from shardrec.tools.synth.avazu_movielens import LIKE
from shardrec.tools.synth.criteo import write_dataset
from shardrec.tools.synth.record import check_and_record, synth_paths

DEFAULT_MAX_VOCAB = 100_000


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
        int | None,
        typer.Option(
            help="Largest number of distinct values of one categorical (criteo and drift; "
            "default 100,000); the other shapes fix their columns' values."
        ),
    ] = None,
    like: Annotated[
        str,
        typer.Option(
            help="criteo (TSV, or --csv), avazu (train.csv: Avazu's 24 columns), movielens (train.csv: "
            "MovieLens-1M's ratings joined with users and movies: quoted titles, genre lists, 1-5 ratings), "
            "drift (day_0 .. day_{N-1} of --days, default 6, in Criteo's TSV with 64-bit hex ids: "
            "new ids appear and old ones fade each day; for managed tables) or yambda "
            "(events.parquet, or --csv, and two item maps: a listening log of about --rows "
            "listens whose label depends on the order of each user's history)."
        ),
    ] = "criteo",
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Write synthetic click logs whose labels follow a hidden model of the features: Criteo's
    format, or Avazu's or MovieLens-1M's shape (--like) for trying a feature spec."""
    if rows <= 0:
        fail(f"--rows must be positive, got {rows}")
    if max_vocab is not None and max_vocab < 4:
        fail(f"--max-vocab must be at least 4, got {max_vocab}")
    if out.exists() and not out.is_dir():
        fail(f"{out}: exists and is not a directory")
    likes = (*LIKE, "drift", "yambda")
    if like not in likes:
        fail(f"--like {like!r} is not one of {', '.join(likes)}")
    if like == "drift" and (csv or gz):
        fail("--like drift writes plain TSV day files: --csv and --gz are for criteo")
    if like == "yambda" and (days or gz):
        fail("--like yambda writes Parquet (or --csv) files: --days and --gz are for text logs")
    if like not in ("criteo", "drift", "yambda") and (days or csv):
        fail(f"--like {like} writes one CSV file: --days and --csv are for criteo")
    if like not in ("criteo", "drift") and max_vocab is not None:
        fail(f"--like {like} fixes its columns' values: --max-vocab is for criteo and drift")
    max_vocab = DEFAULT_MAX_VOCAB if max_vocab is None else max_vocab
    if days < 0:
        fail(f"--days must be 0 (one train file) or more, got {days}")
    if like == "drift":
        days = days or 6
    if days and rows < days:
        empty = f"day_{rows}" + (f" .. day_{days - 1}" if days - rows > 1 else "")
        fail(f"--rows {rows} over {days} days would leave {empty} empty: give a row a day at least")
    settings = _settings(like, rows, seed, days, csv, gz, max_vocab)
    start = time.perf_counter()
    try:
        with sigterm_as_ctrl_c():
            check_and_record(out, synth_paths(out, like, days, csv, gz), settings)
            paths, written, days_stats = _write(out, like, rows, seed, days, csv, gz, max_vocab)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM
        interrupted(
            f"{out}: the files written so far are kept, none half-written; rerun the same command "
            "to finish"
        )
    except ValueError as e:  # a refusal, or a WriteError (no space or permission, one line)
        fail(str(e))
    seconds = time.perf_counter() - start
    if days_stats is not None:
        _show_drift(out, paths, rows, days, days_stats, seconds, json_out)
        return
    result = {"files": [str(p) for p in paths], "rows": written, "seconds": round(seconds, 3)}
    if json_out:
        print_json(result)
    elif like == "yambda":
        console.print(
            f"wrote {written:,} events to {len(paths)} file(s) in {out} ({seconds:.1f} s; of "
            f"{rows:,} asked, the listens users would make after the log's last day are cut)"
        )
    else:
        console.print(f"wrote {rows:,} rows to {len(paths)} file(s) in {out} ({seconds:.1f} s)")


def _write(
    out: Path, like: str, rows: int, seed: int, days: int, csv: bool, gz: bool, max_vocab: int
) -> tuple[list[Path], int, list | None]:
    """Write the files; returns them, the rows they hold and (drift) what each day brought."""
    if like == "drift":
        from shardrec.tools.synth.drift import write_drift

        paths, stats = write_drift(out, rows, seed, days, max_vocab)
        return paths, rows, stats
    if like == "yambda":
        from shardrec.tools.synth.yambda import write_yambda_like

        paths = write_yambda_like(out, rows, seed, csv=csv)
        return paths, _rows_written(paths[0]), None
    if like == "criteo":
        paths = write_dataset(out, rows, seed, days=days, csv=csv, gz=gz, max_vocab=max_vocab)
        return paths, rows, None
    from shardrec.tools.synth.avazu_movielens import write_like

    paths = [out / f"train.csv{'.gz' if gz else ''}"]
    write_like(paths[0], like, rows, seed)
    return paths, rows, None


def _settings(
    like: str, rows: int, seed: int, days: int, csv: bool, gz: bool, max_vocab: int
) -> dict:
    """The settings that fix what `synth --like like` writes (a rerun with others is refused)."""
    used = {
        "criteo": ("days", "csv", "gz", "max_vocab"),
        "drift": ("days", "max_vocab"),
        "yambda": ("csv",),
    }.get(like, ("gz",))
    given = {"days": days, "csv": csv, "gz": gz, "max_vocab": max_vocab}
    return {"like": like, "rows": rows, "seed": seed, **{k: given[k] for k in used}}


def _rows_written(path: Path) -> int:
    """Rows of a written Parquet or CSV (with a header) file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    with path.open("rb") as f:
        return sum(1 for _ in f) - 1


def _show_drift(
    out: Path, paths: list[Path], rows: int, days: int, stats: list, seconds: float, json_out: bool
) -> None:
    """The drifting log, and what each day brought (over the tables whose ids churn)."""
    if json_out:
        print_json(
            {
                "files": [str(p) for p in paths],
                "rows": rows,
                "seconds": round(seconds, 3),
                "days": [asdict(s) for s in stats],
            }
        )
        return
    table = Table(title=f"{out}: {rows:,} rows in {days} days ({seconds:.1f} s)")
    for name in ("day", "rows", "distinct ids", "new ids", "new ids' lookups", "seen once"):
        table.add_column(name, justify="right")
    for s in stats:
        table.add_row(
            str(s.day),
            f"{s.rows:,}",
            f"{s.distinct:,}",
            f"{s.new_distinct_share:.1%}",
            f"{s.new_traffic_share:.1%}",
            f"{s.singleton_share:.1%}",
        )
    console.print(table)
    console.print(
        "ids of the tables whose ids churn; new: never seen on an earlier day (--json: per table, "
        "with the rows that hold 99% of the lookups of ids seen at least once and twice)"
    )


def register(app: typer.Typer) -> None:
    app.command()(synth)
