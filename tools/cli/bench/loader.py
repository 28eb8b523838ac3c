"""`shardrec bench loader`: loader rows/s against the memcpy roofline and torchrec's pipe; many
parts (--part-rows) and multi-hot ids made on the fly (--multihot) instead."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardrec.tools.bench.loader import loader_bench as bench_loader
from shardrec.tools.bench.loader import multihot_bench as loader_multihot
from shardrec.tools.bench.loader import parts_bench as loader_parts
from shardrec.tools.cli.bench.options import JsonFlag, at_least, refuse_unused, show
from shardrec.tools.cli.common import fail, interrupted, sigterm_as_ctrl_c


def loader(
    ctx: typer.Context,
    rows: Annotated[int, typer.Option(help="Rows of generated Criteo-shaped data.")] = 2_000_000,
    global_batch: Annotated[
        int, typer.Option("--global-batch", help="Samples per global batch.")
    ] = 8192,
    rounds: Annotated[
        int,
        typer.Option(
            help="Interleaved rounds after a warm-up; ratios are medians of same-round ones."
        ),
    ] = 7,
    max_batches: Annotated[
        int,
        typer.Option(
            "--max-batches",
            help="Batches per timed run (0: as many as take ~0.5 s, sized by each configuration's "
            "warm-up; with --part-rows: one shuffle group's, 2,048 at the default batch).",
        ),
    ] = 0,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            "--work-dir", help="Where to write the temporary data (default: system temp)."
        ),
    ] = None,
    parts: Annotated[
        int,
        typer.Option(
            help=(
                "Parts of the many-part run (default: a 1/100 Criteo-1TB-shaped dataset's, 24 days x 5 "
                "at the default 128 MiB chunk); one part is always run too."
            )
        ),
    ] = bench_loader.DEFAULT_PARTS,
    part_rows: Annotated[
        int,
        typer.Option(
            "--part-rows",
            help=(
                "Instead: --parts parts of this many rows (one part's files hard-linked; Criteo 1TB: "
                "--parts 10000 --part-rows 450000), shuffled rows/s vs the one part, time to the first batch, "
                "memory, under ulimit -n 1024."
            ),
        ),
    ] = 0,
    multihot: Annotated[
        bool,
        typer.Option(
            "--multihot",
            help="Instead: samples/s per rank of DLRMv2's multi-hot ids made on the fly, against the one-hot loader.",
        ),
    ] = False,
    table_rows: Annotated[
        str,
        typer.Option(
            "--table-rows", help="With --multihot: index table rows to run, comma-separated."
        ),
    ] = "1000000,10000000",
    cache: Annotated[
        Path | None,
        typer.Option(
            help="With --multihot: folder of the index tables (default: the multi-hot cache)."
        ),
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Loader rows/s as torchrec Batches on one thread, vs the memcpy roofline and torchrec's
    pipe."""
    _refuse_unused(ctx, multihot, part_rows)
    _check_options(rows, global_batch, rounds, max_batches, work_dir, parts, part_rows, multihot)
    sizes = _table_sizes(table_rows) if multihot else []
    try:
        with sigterm_as_ctrl_c():  # a kill removes its temporary folder too, as Ctrl-C does
            if part_rows:
                result = loader_parts.run_parts_bench(
                    part_rows, parts, global_batch, rounds, max_batches, work_dir
                )
                report = loader_parts.print_result
            elif multihot:
                result = loader_multihot.run_multihot_bench(
                    rows, global_batch, sizes, rounds, max_batches, work_dir, cache
                )
                report = loader_multihot.print_result
            else:
                result = bench_loader.run_bench(
                    rows, global_batch, rounds, max_batches, work_dir, parts
                )
                report = bench_loader.print_result
    except KeyboardInterrupt:
        interrupted("nothing measured")
    except loader_parts.LinkLimitError as e:
        fail(str(e))
    show(result, json_out, report)


def _table_sizes(table_rows: str) -> list[int]:
    """--table-rows as row counts; one line where it is not a list of positive integers."""
    try:
        sizes = [int(v) for v in table_rows.split(",")]
    except ValueError:
        fail(
            f"--table-rows {table_rows!r}: expected comma-separated integers, e.g. 1000000,10000000"
        )
    if min(sizes) < 1:
        fail(f"--table-rows {table_rows!r}: every table needs at least 1 row")
    return sizes


def _refuse_unused(ctx: typer.Context, multihot: bool, part_rows: int) -> None:
    """One line naming an option given that the chosen benchmark would ignore."""
    if multihot and part_rows:
        fail("--multihot and --part-rows are two different benchmarks: give one")
    if part_rows:  # its rows are --parts x --part-rows
        refuse_unused(ctx, ("rows",), "with --part-rows")
    if multihot:  # its data is one part
        refuse_unused(ctx, ("parts",), "with --multihot")
    else:
        refuse_unused(ctx, ("table_rows", "cache"), "without --multihot")


def _check_options(
    rows: int,
    global_batch: int,
    rounds: int,
    max_batches: int,
    work_dir: Path | None,
    parts: int,
    part_rows: int,
    multihot: bool,
) -> None:
    """One line naming the first bad option, before any data is written; an option the chosen
    benchmark does not read is not checked (--part-rows makes its own rows, --multihot one part)."""
    at_least("--global-batch", global_batch, 1)
    at_least("--rounds", rounds, 1)
    at_least("--max-batches", max_batches, 0, "0: sized by the warm-up")
    if not part_rows and rows < 2 * global_batch:
        fail(f"--rows {rows}: must be >= 2 x --global-batch ({2 * global_batch:,})")
    if work_dir is not None and not work_dir.exists():
        fail(f"--work-dir {work_dir}: does not exist")
    if work_dir is not None and not work_dir.is_dir():
        fail(f"--work-dir {work_dir}: not a directory")
    at_least("--part-rows", part_rows, 0, "0: off")
    if 0 < part_rows < global_batch:
        fail(f"--part-rows {part_rows}: must be >= --global-batch ({global_batch:,})")
    if part_rows or not multihot:
        at_least("--parts", parts, 1)
    if not part_rows and not multihot and parts > rows:  # each part holds rows of --rows
        fail(f"--parts {parts}: must be <= --rows ({rows:,})")


def register(bench_app: typer.Typer) -> None:
    bench_app.command("loader")(loader)
