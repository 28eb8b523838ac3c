"""`shardrec bench preprocess`: preprocess MB/s and peak RSS against a polars pipeline; .gz
(--gzip) and Parquet (--parquet) instead."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from shardrec.tools.bench.preprocess import preprocess_bench as bench_preprocess
from shardrec.tools.cli.bench.options import JsonFlag, at_least, positive, refuse_unused, show
from shardrec.tools.cli.common import fail, interrupted, sigterm_as_ctrl_c
from shardrec.tools.console import console

LIKES = ("criteo", "movielens", "avazu")


def preprocess(
    ctx: typer.Context,
    size_gb: Annotated[
        float,
        typer.Option(
            help="Size of the generated text in GB (with --parquet: the text the file holds); "
            "under 0.5 a run says it is too small to measure; the goals were measured at >= 1."
        ),
    ] = 1.0,
    workers: Annotated[int, typer.Option(help="Worker processes of the preprocess run.")] = 1,
    chunk_mb: Annotated[float, typer.Option(help="--chunk-mb of the preprocess run.")] = 128,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            help="Keep the generated file here and reuse it (default: a temporary directory)."
        ),
    ] = None,
    like: Annotated[
        str,
        typer.Option(
            help="criteo (Criteo's TSV, the default parser), or movielens / avazu (synth --like's CSV with its "
            "inferred spec: string categoricals, quoting, lists)."
        ),
    ] = "criteo",
    gzip: Annotated[
        bool,
        typer.Option(
            "--gzip",
            help="Instead: the same rows as .gz against plain text on 1 worker (per CPU-s), and the .gz on "
            "--workers against 1 (wall), no polars.",
        ),
    ] = False,
    parquet: Annotated[
        bool,
        typer.Option(
            "--parquet",
            help="Instead: the --like rows as a Parquet file with its inferred spec, rows per CPU-second "
            "against polars reading the same file (goal 1.5x).",
        ),
    ] = False,
    rounds: Annotated[
        int,
        typer.Option(
            help="Interleaved rounds after a warm-up; ratios are medians of same-round ones."
        ),
    ] = 3,
    json_out: JsonFlag = False,
) -> None:
    """Preprocess MB/s and peak RSS against a polars pipeline doing the same work (1 and all
    threads), same file."""
    _check_options(ctx, size_gb, workers, chunk_mb, rounds, like, gzip, parquet)
    try:
        with sigterm_as_ctrl_c():  # a kill ends its child runs too (proctree.py), as Ctrl-C does
            _preprocess_bench(
                size_gb, workers, chunk_mb, work_dir, like, gzip, parquet, rounds, json_out
            )
    except KeyboardInterrupt:  # its temporary folder is removed on the way out
        interrupted("nothing measured")


def _check_options(
    ctx: typer.Context,
    size_gb: float,
    workers: int,
    chunk_mb: float,
    rounds: int,
    like: str,
    gzip: bool,
    parquet: bool,
) -> None:
    """One line naming the first bad option, before any data is generated."""
    positive("--size-gb", size_gb)
    at_least("--workers", workers, 1)
    positive("--chunk-mb", chunk_mb)
    at_least("--rounds", rounds, 1)
    if parquet and gzip:
        fail("--parquet and --gzip are two different benchmarks: give one")
    if gzip:  # its rows are Criteo's
        refuse_unused(ctx, ("like",), "with --gzip")
    if like not in LIKES:
        fail(f"--like {like!r} is not one of {', '.join(LIKES)}")


def _preprocess_bench(
    size_gb: float,
    workers: int,
    chunk_mb: float,
    work_dir: Path | None,
    like: str,
    gzip: bool,
    parquet: bool,
    rounds: int,
    json_out: bool,
) -> None:
    from shardrec.tools.bench.preprocess.polars_pipeline import INSTALL_HINT
    from shardrec.tools.bench.preprocess.spec_bench import print_like_report, run_like_bench

    if gzip:
        _gzip_bench(size_gb, workers, work_dir, chunk_mb, rounds, json_out)
        return
    if bench_preprocess.polars_version() is None:
        fail(INSTALL_HINT)  # fail() prints text, not markup: the hint's [bench] stays
    tmp = None
    if work_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="shardrec-bench-")
        work_dir = Path(tmp.name)
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        if parquet:
            from shardrec.tools.bench.preprocess.parquet_bench import (
                print_parquet_report,
                run_parquet_bench,
            )

            result = run_parquet_bench(like, size_gb, workers, work_dir, chunk_mb, rounds)
        elif like == "criteo":
            result = bench_preprocess.run_bench(size_gb, workers, work_dir, chunk_mb, rounds)
        else:
            result = run_like_bench(like, size_gb, workers, work_dir, chunk_mb, rounds)
    except RuntimeError as e:
        fail(str(e))
    finally:
        if tmp is not None:
            tmp.cleanup()
    if parquet:
        show(result, json_out, lambda r: print_parquet_report(r, console))
    elif like == "criteo":
        show(result, json_out, bench_preprocess.print_report)
    else:
        show(result, json_out, lambda r: print_like_report(r, console))


def _gzip_bench(
    size_gb: float,
    workers: int,
    work_dir: Path | None,
    chunk_mb: float,
    rounds: int,
    json_out: bool,
) -> None:
    from shardrec.tools.bench.preprocess.gzip_bench import print_gzip_report, run_gzip_bench

    with tempfile.TemporaryDirectory(prefix="shardrec-bench-") as tmp:
        work = work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        try:
            result = run_gzip_bench(size_gb, workers, work, chunk_mb, rounds)
        except RuntimeError as e:
            fail(str(e))
    show(result, json_out, print_gzip_report)


def register(bench_app: typer.Typer) -> None:
    bench_app.command("preprocess")(preprocess)
