"""`shardrec preprocess`: raw click logs -> a training-ready dataset directory."""

from __future__ import annotations

import os
import time
from dataclasses import MISSING, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from shardrec.tools.cli.common import (
    check_not_a_run,
    fail,
    interrupted,
    print_json,
    sigterm_as_ctrl_c,
)
from shardrec.tools.console import console, err_console
from shardrec.tools.preprocess.parse.criteo_text import Schema
from shardrec.tools.preprocess.settings import PreprocessConfig
from shardrec.trainer.job.toml_values import field_help

if (
    TYPE_CHECKING
):  # the pipeline and the spec parser are imported by the command, not by every CLI start
    from shardrec.dataloader.spec.feature_spec import FeatureSpec
    from shardrec.tools.preprocess.kept_rows import PreprocessResult


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


def _parse_max_ids(values: str, hashing: bool, num_sparse: int) -> list[int]:
    """--max-ids as integers, refused by its flag where hashing (no --min-count) cannot use them
    (PreprocessConfig checks the same for library callers, by its key)."""
    from shardrec.dataloader.spec.feature_spec import MAX_HASH_SIZE

    try:
        sizes = [int(v) for v in values.split(",")]
    except ValueError:
        fail(f"--max-ids {values!r}: expected an integer or a comma-separated list of integers")
    if len(sizes) not in (1, num_sparse):
        fail(
            f"--max-ids {values}: {len(sizes)} values; give 1 or one per sparse feature "
            f"({num_sparse})"
        )
    bad = next((n for n in sizes if not 2 <= n <= MAX_HASH_SIZE), None)
    if hashing and bad is not None:
        fail(
            f"--max-ids {values}: {bad} is not 2 to {MAX_HASH_SIZE} (2^63 - 1) table rows: id 0 "
            "is the missing value, and ids are 64-bit"
        )
    return sizes


def _help(name: str) -> str:
    """The help of an option: its setting's docstring (PreprocessConfig's or Schema's), on one
    line."""
    return " ".join(_HELPS[name].split())


def _defaults(cls: type) -> dict[str, Any]:
    return {
        f.name: f.default if f.default is not MISSING else f.default_factory()
        for f in fields(cls)
        if f.default is not MISSING or f.default_factory is not MISSING
    }


# One home for the help and defaults of the options that stand for a setting: the settings'
# dataclasses.
_HELPS = {**field_help(Schema), **field_help(PreprocessConfig)}
_DEFAULTS = {**_defaults(Schema), **_defaults(PreprocessConfig)}


# Options that describe the text: a spec file says all of it, so they may not come with --spec.
_TEXT_OPTIONS = (
    "csv",
    "delimiter",
    "header",
    "num_dense",
    "num_sparse",
    "min_fields",
    "dense_transform",
)


def _spec(ctx: typer.Context, path: Path | None) -> FeatureSpec | None:
    from shardrec.dataloader.spec.feature_spec import SpecError
    from shardrec.dataloader.spec.spec_file import load_spec

    if path is None:
        return None
    given = [
        n for n in _TEXT_OPTIONS if ctx.get_parameter_source(n).name != "DEFAULT"
    ]  # typer's click enum
    if given:
        fail(
            f"--{given[0].replace('_', '-')}: {path} describes the columns and their format; set it there instead"
        )
    try:
        return load_spec(path)
    except SpecError as e:
        fail(str(e))


def _check_amounts(
    workers: int, chunk_mb: float, vocab_memory_mb: float, max_skipped_fraction: float
) -> None:
    """One line naming the first bad amount by its flag, before any input is read or the spec
    loaded (PreprocessConfig checks the same for library callers, by its keys)."""
    if workers < 1:
        fail(f"--workers {workers}: must be >= 1")
    if chunk_mb <= 0:
        fail(f"--chunk-mb {chunk_mb:g}: must be > 0")
    if vocab_memory_mb <= 0:
        fail(f"--vocab-memory-mb {vocab_memory_mb:g}: must be > 0")
    if not 0 <= max_skipped_fraction <= 1:
        fail(f"--max-skipped-fraction {max_skipped_fraction:g}: must be in [0, 1]")


def preprocess(
    ctx: typer.Context,
    inputs: Annotated[list[Path], typer.Argument(help=_help("inputs"))],
    out: Annotated[Path, typer.Option(help=_help("out"))],
    spec: Annotated[Path | None, typer.Option(metavar="FILE", help=_help("spec"))] = None,
    events: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE",
            help="An event spec (TOML): the inputs are an event log (Parquet, CSV or TSV with a "
            "header; one row per event of a user), whose listens with enough history become the "
            'samples of wall-clock windows (README, "Sequences, event logs and DLRMv4 (MLPerf)").',
        ),
    ] = None,
    max_ids: Annotated[str, typer.Option(help=_help("max_ids"))] = ",".join(
        map(str, _DEFAULTS["max_ids"])
    ),
    min_count: Annotated[int, typer.Option(help=_help("min_count"))] = _DEFAULTS["min_count"],
    raw_ids: Annotated[
        str, typer.Option(metavar="NAMES", help=_help("raw_ids"), show_default=False)
    ] = "",
    vocab_memory_mb: Annotated[float, typer.Option(help=_help("vocab_memory_mb"))] = _DEFAULTS[
        "vocab_memory_mb"
    ],
    layout: Annotated[str, typer.Option(help=_help("layout"))] = _DEFAULTS["layout"],
    val_half: Annotated[str, typer.Option(help=_help("val_half"))] = _DEFAULTS["val_half"],
    csv: Annotated[
        bool, typer.Option("--csv", help="Comma-separated with a header line (label,I1..,C1..).")
    ] = False,
    delimiter: Annotated[
        str, typer.Option(help=f"{_help('delimiter')} Ignored with --csv.", show_default=False)
    ] = _DEFAULTS["delimiter"],
    header: Annotated[bool, typer.Option("--header", help=_help("header"))] = _DEFAULTS["header"],
    num_dense: Annotated[int, typer.Option(help=_help("num_dense"))] = _DEFAULTS["num_dense"],
    num_sparse: Annotated[int, typer.Option(help=_help("num_sparse"))] = _DEFAULTS["num_sparse"],
    min_fields: Annotated[
        int | None, typer.Option(help=_help("min_fields"), show_default=False)
    ] = None,
    dense_transform: Annotated[str, typer.Option(help=_help("dense_transform"))] = _DEFAULTS[
        "dense_transform"
    ],
    float16: Annotated[
        bool, typer.Option("--float16", help="Store dense values as float16 (else float32).")
    ] = False,
    workers: Annotated[int, typer.Option(help=_help("workers"))] = _DEFAULTS["workers"],
    chunk_mb: Annotated[float, typer.Option(help=_help("chunk_mb"))] = _DEFAULTS["chunk_mb"],
    strict: Annotated[bool, typer.Option("--strict", help=_help("strict"))] = _DEFAULTS["strict"],
    max_skipped_fraction: Annotated[
        float, typer.Option(help=_help("max_skipped_fraction"))
    ] = _DEFAULTS["max_skipped_fraction"],
    part: Annotated[str | None, typer.Option(help=_help("part"))] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Turn click logs into a sharded-training dataset (parts + manifest.json): Criteo's rows, or
    any CSV, TSV or Parquet file a feature spec (--spec) describes."""
    from shardrec.dataloader.format.manifest import DatasetError
    from shardrec.dataloader.util.locks import dataset_lock
    from shardrec.tools.preprocess.pipeline import check_inputs, run_preprocess
    from shardrec.tools.preprocess.pool import WorkerDied
    from shardrec.tools.preprocess.tasks.bad_rows import MalformedRowError
    from shardrec.tools.preprocess.tasks.task_text import InputError

    check_not_a_run(out)
    if events is not None:
        _preprocess_events(ctx, inputs, out, events, json_out)
        return
    _check_amounts(workers, chunk_mb, vocab_memory_mb, max_skipped_fraction)
    feature_spec = _spec(ctx, spec)
    try:
        schema = Schema(
            num_dense,
            num_sparse,
            "," if csv else delimiter.replace("\\t", "\t"),
            header or csv,
            min_fields,
        )
        cfg = PreprocessConfig(
            inputs=inputs, out=out, min_count=min_count,
            max_ids=_parse_max_ids(
                max_ids, min_count <= 0, len(feature_spec.sparse) if feature_spec else num_sparse
            ),
            raw_ids=[n.strip() for n in raw_ids.split(",") if n.strip()],
            vocab_memory_mb=vocab_memory_mb, layout=layout, val_half=val_half, schema=schema,
            dense_transform=dense_transform, dense_dtype="float16" if float16 else "float32",
            workers=workers, chunk_mb=chunk_mb,
            strict=strict, max_skipped_fraction=max_skipped_fraction, part=_parse_part(part),
            spec=feature_spec, spec_file=str(spec or ""),
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
        inputs = check_inputs(cfg)  # before --out is made: a refused run leaves no folder
        lock = dataset_lock(
            out, cfg.part
        )  # one writer at a time; the kernel frees it if this one dies
        try:
            with sigterm_as_ctrl_c():
                result = run_preprocess(cfg, bar, inputs)
        finally:
            os.close(lock)
            if bar.shown:  # rich's stop() prints a newline even for a bar never drawn
                bar.progress.stop()
    except (MalformedRowError, InputError, DatasetError, ValueError, WorkerDied) as e:
        fail(str(e))
    except OSError as e:  # e.g. no space or no permission under --out
        fail(f"{e.filename or out}: {e.strerror or e}")
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM
        interrupted(f"{out}: finished tasks are kept; rerun the same command to finish")
    seconds = time.perf_counter() - start
    if json_out:
        print_json(_as_json(result, seconds))
    else:
        _print_tables(result, seconds, bar, cfg.parquet)
    if result.manifest is not None:
        _warn_one_class(out, result.manifest)


def _warn_one_class(out: Path, manifest) -> None:
    """A warning (stderr) for each split whose labels are all one class: its AUC cannot be
    measured, and a train split of one class teaches nothing; most often a label column or rule
    that does not say what the user meant."""
    from shardrec.dataloader.format.integrity import one_label
    from shardrec.dataloader.format.part_file import manifest_layout, open_part

    layout = manifest_layout(manifest, out)
    for split, info in manifest.splits.items():
        label = one_label(open_part(out, split, p, manifest, layout) for p in info.parts)
        if label is not None:
            spec = manifest.options.get("spec")
            rule = " (check the spec's label column and its threshold or mapping)" if spec else ""
            err_console.print(
                f"warning: {out}: every label of split {split} is {label}: an AUC needs both "
                f"0 and 1{rule}",
                highlight=False,
                soft_wrap=True,
            )


def _preprocess_events(
    ctx: typer.Context, inputs: list[Path], out: Path, events: Path, json_out: bool
) -> None:
    """`--events SPEC`: an event log -> an event-log dataset; the text options do not apply."""
    from shardrec.dataloader.format.manifest import DatasetError
    from shardrec.dataloader.spec.event_spec import load_event_spec
    from shardrec.dataloader.spec.feature_spec import SpecError
    from shardrec.tools.preprocess.events.event_dataset import build_event_dataset, describe

    given = [
        name
        for name in ctx.params
        if name not in ("inputs", "out", "events", "json_out")
        and ctx.get_parameter_source(name).name != "DEFAULT"
    ]
    if given:
        fail(
            f"--{given[0].replace('_', '-')}: not for an event log ({events} describes it; "
            "the options of click logs do not apply)"
        )
    start = time.perf_counter()
    try:
        spec = load_event_spec(events)
        with sigterm_as_ctrl_c():
            manifest = build_event_dataset(inputs, spec, events, out)
    except (SpecError, DatasetError, ValueError) as e:
        fail(str(e))
    except OSError as e:
        fail(f"{e.filename or out}: {e.strerror or e}")
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM
        interrupted(
            f"{out}: the event-log dataset is not finished (no manifest, so nothing there is read "
            "as data); rerun the same command to make it"
        )
    summary = {**describe(manifest), "seconds": round(time.perf_counter() - start, 3)}
    if json_out:
        print_json(summary)
        return
    console.print(
        f"{out}: {summary['users']:,} users, {summary['events']:,} events in "
        f"{summary['parts']} part(s), {summary['seconds']:.1f} s"
    )
    for split, s in summary["splits"].items():
        rate = summary["positive_rate"].get(split, 0.0)
        console.print(
            f"  {split}: {s['anchors']:,} samples in {s['windows']} window(s), "
            f"{rate:.1%} listen-plus"
        )
    console.print(f"  history: {summary['history_length_mean']:.1f} events kept on average")


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
        "cpu_seconds_by_stage": result.cpu_s_by_stage,
        "cardinality": {f.name: f.cardinality for f in m.sparse_features} if m else None,
    }


def _print_tables(result: PreprocessResult, seconds: float, bar: _Bar, parquet: bool) -> None:
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
            f"{f.cardinality:,}" if f.cardinality else "raw ids",  # 64-bit ids, no table size
            f.dtype,
            f"{int(f.stats.get('distinct_ids', 0)):,}",
            f"{f.stats.get('top1_share', 0):.3f}",
        )
    console.print(feats)
    console.print(_rate_line(result, seconds, bar, parquet), highlight=False)


def _rate_line(result: PreprocessResult, seconds: float, bar: _Bar, parquet: bool) -> str:
    """The last line: the parse rate the bar showed (same bytes, same seconds), or no rate at all
    when every task was already done. Parquet's bytes are its columns' uncompressed size (its
    metadata's), read, not parsed."""
    read = (
        f"{result.lines:,} rows, {result.bytes / 1e6:,.1f} MB of Parquet columns (uncompressed)"
        if parquet
        else f"{result.lines:,} lines, {result.bytes / 1e6:,.1f} MB of text"
    )
    if result.tasks_run == 0:
        return (
            f"nothing to do: all {result.tasks_total} task(s) were already done; {read} "
            f"({seconds:.1f} s)"
        )
    mbps = bar.parsed_text / max(bar.parse_seconds, 1e-9) / 1e6
    return (
        f"{read}; {'read' if parquet else 'parsed'} at {mbps:,.1f} MB/s "
        f"({bar.parsed_text / 1e6:,.1f} MB in {bar.parse_seconds:.1f} s); {seconds:.1f} s in all"
    )


def register(app: typer.Typer) -> None:
    app.command()(preprocess)
