"""`shardrec preprocess`: raw click logs -> a training-ready dataset directory."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from shardrec.dataloader.format import DatasetError
from shardrec.dataloader.locks import dataset_lock
from shardrec.tools.cli.common import console, fail, print_json
from shardrec.tools.preprocess.parse import DENSE_TRANSFORMS, Schema
from shardrec.tools.preprocess.pipeline import PreprocessConfig, PreprocessResult, run_preprocess
from shardrec.tools.preprocess.pool import WorkerDied
from shardrec.tools.preprocess.task import InputError, MalformedRowError


class _Bar:
    """Progress sink drawing a rich bar with rows/s and MB/s of text parsed.

    The bar appears at the first pass (an input error found before it draws no empty bar), and
    the parse pass's own time and bytes are kept, so that the last line states the rate it showed.
    """

    def __init__(self, progress: Progress) -> None:
        self.progress, self.task, self.shown = progress, None, False
        self.t0, self.rows, self.text, self.disk = time.perf_counter(), 0, 0, 0
        self.parse_seconds, self.parsed_text = 0.0, 0

    def start(self, total_bytes: int, label: str) -> None:
        if not self.shown:
            self.progress.start()
            self.shown = True
        self.t0, self.rows, self.text, self.disk = time.perf_counter(), 0, 0, 0
        self.task = self.progress.add_task(label, total=max(total_bytes, 1), rate="")

    def advance(self, disk_bytes: int, text_bytes: int, lines: int) -> None:
        self.rows += lines
        self.text += text_bytes
        self.disk += disk_bytes
        dt = max(time.perf_counter() - self.t0, 1e-9)
        if self.rows:
            self.parse_seconds, self.parsed_text = dt, self.text
            rate = f"{self.rows / dt:,.0f} rows/s  {self.text / dt / 1e6:,.1f} MB/s"
        else:  # the counting pass reports no rows
            rate = f"{self.disk / dt / 1e6:,.1f} MB/s"
        self.progress.update(self.task, advance=disk_bytes, rate=rate)


def _parse_part(part: str | None) -> tuple[int, int] | None:
    if part is None:
        return None
    try:
        i, n = (int(x) for x in part.split("/"))
    except ValueError:
        fail(f"--part {part!r}: expected i/n, e.g. 0/4")
    return i, n


def _parse_max_ids(values: str) -> list[int]:
    try:
        return [int(v) for v in values.split(",")]
    except ValueError:
        fail(f"--max-ids {values!r}: expected an integer or a comma-separated list of integers")


def preprocess(
    inputs: Annotated[
        list[Path], typer.Argument(help="Kaggle train.txt, 1TB day files (.gz too), or directories of them.")
    ],
    out: Annotated[Path, typer.Option(help="Output dataset directory.")],
    max_ids: Annotated[
        str, typer.Option(help="Hashing mode: table rows per feature (N, or N1,N2,... one per feature).")
    ] = "10000000",
    min_count: Annotated[
        int, typer.Option(help="Vocabulary mode when > 0: keep values seen at least K times in training days.")
    ] = 0,
    vocab_memory_mb: Annotated[
        float,
        typer.Option(
            help=(
                "Vocabulary mode: MiB of (value, count) pairs one process holds while counting (per worker) "
                "or merging; more is spilled to sorted runs on disk and merged in value ranges."
            )
        ),
    ] = 256,
    layout: Annotated[
        str, typer.Option(help="auto, kaggle (7 pseudo-days) or days (one file per day, last halved).")
    ] = "auto",
    val_half: Annotated[str, typer.Option(help="Which half of the last day is validation: first or second.")] = "first",
    csv: Annotated[bool, typer.Option("--csv", help="Comma-separated with a header line (label,I1..,C1..).")] = False,
    delimiter: Annotated[
        str,
        typer.Option(
            help="Field separator (ignored with --csv): a tab unless given ('\\t' is read as a tab).",
            show_default=False,
        ),
    ] = "\t",
    header: Annotated[bool, typer.Option("--header", help="Each file starts with a header line to skip.")] = False,
    num_dense: Annotated[int, typer.Option(help="Integer columns after the label.")] = 13,
    num_sparse: Annotated[int, typer.Option(help="Hex categorical columns after the integers.")] = 26,
    min_fields: Annotated[
        int | None,
        typer.Option(
            help=(
                "Fewest fields a row may have; its missing trailing fields are empty. Shorter rows are malformed "
                "(too_few_fields: skipped, or --strict stops). Default: all fields but 3 (37 for Criteo, whose "
                "writer strips up to 3 trailing empty fields)."
            ),
            show_default=False,
        ),
    ] = None,
    dense_transform: Annotated[str, typer.Option(help=f"One of {', '.join(DENSE_TRANSFORMS)}.")] = "log1p",
    float16: Annotated[bool, typer.Option("--float16", help="Store dense values as float16.")] = False,
    workers: Annotated[int, typer.Option(help="Worker processes.")] = 1,
    chunk_mb: Annotated[float, typer.Option(help="MiB of text per task and per output part.")] = 128,
    strict: Annotated[bool, typer.Option("--strict", help="Stop at the first malformed row (exit 1).")] = False,
    max_skipped_fraction: Annotated[
        float,
        typer.Option(
            help=(
                "Most malformed rows to skip, as a share of all lines (0.01: 1%); more, or no row kept, is an "
                "error and no manifest is written. Finished tasks are kept: rerun with a higher value to accept."
            )
        ),
    ] = 0.01,
    part: Annotated[
        str | None,
        typer.Option(
            help=(
                "i/n: this machine's share (tasks i, i+n, ...), e.g. $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT, "
                "into a shared --out; then one run without --part writes the manifest. Vocabulary mode: run every "
                "part twice (count, then map)."
            )
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Turn Criteo-shaped click logs into a sharded-training dataset (parts + manifest.json)."""
    try:
        schema = Schema(
            num_dense, num_sparse, "," if csv else delimiter.replace("\\t", "\t"), header or csv, min_fields
        )
        cfg = PreprocessConfig(
            inputs=inputs, out=out, max_ids=_parse_max_ids(max_ids), min_count=min_count,
            vocab_memory_mb=vocab_memory_mb, layout=layout, val_half=val_half, schema=schema,
            dense_transform=dense_transform, dense_dtype="float16" if float16 else "float32",
            workers=workers, chunk_mb=chunk_mb,
            strict=strict, max_skipped_fraction=max_skipped_fraction, part=_parse_part(part),
        )  # fmt: skip
    except ValueError as e:
        fail(str(e))
    start = time.perf_counter()
    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    bar = _Bar(Progress(*columns, console=console, disable=json_out, transient=False))
    try:
        lock = dataset_lock(out, cfg.part)  # one writer at a time; the kernel frees it if this one dies
        try:
            result = run_preprocess(cfg, bar)
        finally:
            os.close(lock)
            if bar.shown:  # rich's stop() prints a newline even for a bar never drawn
                bar.progress.stop()
    except (MalformedRowError, InputError, DatasetError, ValueError, WorkerDied) as e:
        fail(str(e))
    except OSError as e:  # e.g. no space or no permission under --out
        fail(f"{e.filename or out}: {e.strerror or e}")
    seconds = time.perf_counter() - start
    if json_out:
        print_json(_as_json(result, seconds))
    else:
        _print_tables(result, seconds, bar)


def _as_json(result: PreprocessResult, seconds: float) -> dict:
    m = result.manifest
    return {
        "complete": m is not None,
        "lines": result.lines,
        "text_bytes": result.bytes,
        "rows_kept": result.kept,
        "rows_skipped": result.skipped,
        "first_errors": result.errors,
        "tasks_run": result.tasks_run,
        "tasks_total": result.tasks_total,
        "seconds": round(seconds, 3),
        "cardinality": {f.name: f.cardinality for f in m.sparse_features} if m else None,
    }


def _print_tables(result: PreprocessResult, seconds: float, bar: _Bar) -> None:
    rows = Table(title="rows")
    rows.add_column("split / reason")
    rows.add_column("rows", justify="right")
    for split, n in result.kept.items():
        rows.add_row(f"kept: {split}", f"{n:,}")
    for reason, n in result.skipped.items():
        rows.add_row(f"skipped: {reason}", f"{n:,}")
    console.print(rows)
    for line in result.errors:
        console.print(f"  {line}", highlight=False)
    if result.manifest is None:
        console.print(
            f"ran {result.tasks_run} task(s); others are unfinished: rerun without --part to finish and merge"
        )
        return
    feats = Table(title="features")
    for col in ("feature", "cardinality", "dtype", "distinct ids", "top 1% share"):
        feats.add_column(col, justify="right" if col != "feature" else "left")
    for f in result.manifest.sparse_features:
        feats.add_row(
            f.name,
            f"{f.cardinality:,}",
            f.dtype,
            f"{int(f.stats.get('distinct_ids', 0)):,}",
            f"{f.stats.get('top1_share', 0):.3f}",
        )
    console.print(feats)
    console.print(_rate_line(result, seconds, bar), highlight=False)


def _rate_line(result: PreprocessResult, seconds: float, bar: _Bar) -> str:
    """The last line: the parse rate the bar showed (same bytes, same seconds), or no rate at all
    when every task was already done."""
    if result.tasks_run == 0:
        return (
            f"nothing to do: all {result.tasks_total} task(s) were already done; {result.lines:,} lines, "
            f"{result.bytes / 1e6:,.1f} MB of text ({seconds:.1f} s)"
        )
    mbps = bar.parsed_text / max(bar.parse_seconds, 1e-9) / 1e6
    return (
        f"{result.lines:,} lines, {result.bytes / 1e6:,.1f} MB of text; parsed at {mbps:,.1f} MB/s "
        f"({bar.parsed_text / 1e6:,.1f} MB in {bar.parse_seconds:.1f} s); {seconds:.1f} s in all"
    )


def register(app: typer.Typer) -> None:
    app.command()(preprocess)
