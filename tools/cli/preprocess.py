"""`shardrec preprocess`: raw click logs -> a training-ready dataset directory."""

from __future__ import annotations

import os
import time
from dataclasses import MISSING, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from shardrec.tools.cli.common import (
    check_not_a_run,
    fail,
    interrupted,
    print_json,
    sigterm_as_ctrl_c,
)
from shardrec.tools.cli.preprocess_report import Bar, as_json, print_tables, warn_one_class
from shardrec.tools.console import console
from shardrec.tools.preprocess.parse.criteo_text import Schema
from shardrec.tools.preprocess.settings import PreprocessConfig, remove_run_output
from shardrec.trainer.job.toml_values import field_help

if (
    TYPE_CHECKING
):  # the pipeline and the spec parser are imported by the command, not by every CLI start
    from shardrec.dataloader.spec.feature_spec import FeatureSpec


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
    from shardrec.tools.preprocess.inputs import RowsRefused
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
    bar = Bar(Progress(*columns, console=console, disable=json_out, transient=False))
    before = {p.name for p in out.iterdir()} if out.is_dir() else None
    try:
        inputs = check_inputs(cfg)  # before --out is made: a refused run leaves no folder
        lock = dataset_lock(
            out, cfg.part
        )  # one writer at a time; the kernel frees it if this one dies
        try:
            with sigterm_as_ctrl_c(), bar.compiles_apart():
                result = run_preprocess(cfg, bar, inputs)
        finally:
            os.close(lock)
            if bar.shown:  # rich's stop() prints a newline even for a bar never drawn
                bar.progress.stop()
    except RowsRefused as e:
        # No rerun of this command finishes it: the corrected one finds no folder (under --part,
        # other machines' tasks are in it).
        if e.final and cfg.part is None:
            remove_run_output(out, before)
        fail(str(e))
    except (MalformedRowError, InputError, DatasetError, ValueError, WorkerDied) as e:
        fail(str(e))
    except OSError as e:  # e.g. no space or no permission under --out
        fail(f"{e.filename or out}: {e.strerror or e}")
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM
        interrupted(f"{out}: finished tasks are kept; rerun the same command to finish")
    seconds = time.perf_counter() - start
    if json_out:
        print_json(as_json(result, seconds))
    else:
        print_tables(result, seconds, bar, cfg.parquet)
    if result.manifest is not None:
        warn_one_class(out, result.manifest)


def _preprocess_events(
    ctx: typer.Context, inputs: list[Path], out: Path, events: Path, json_out: bool
) -> None:
    """`--events SPEC`: an event log -> an event-log dataset; the text options do not apply."""
    from shardrec.dataloader.format.manifest import DatasetError
    from shardrec.dataloader.spec.event_spec_file import load_event_spec
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


def register(app: typer.Typer) -> None:
    app.command()(preprocess)
