"""`shardrec predict MODEL INPUT`: probabilities of an exported model, in one process."""

from __future__ import annotations

import io
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from shardrec.tools.cli.common import fail, print_json
from shardrec.tools.console import err_console


def _write(probs: np.ndarray, out: Path | None) -> None:
    """One probability per line (stdout without --out), or a float32 .npy for a .npy path."""
    from shardrec.dataloader.util.files import atomic_open

    if out is None:
        np.savetxt(sys.stdout, probs, fmt="%.9g")
        return
    buffer = io.BytesIO()
    if out.suffix == ".npy":
        np.save(buffer, probs.astype(np.float32))
    else:
        np.savetxt(buffer, probs, fmt="%.9g")
    with atomic_open(out) as f:
        f.write(buffer.getvalue())


def _holds_predictions(path: Path) -> bool:
    """Whether `path` is what _write writes (a .npy of a 1-D float32 array, or text whose first
    line is a number), read by its header or first line only: --out replaces such a file (a
    rerun), never another."""
    fmt = np.lib.format
    try:
        with path.open("rb") as f:
            if f.read(6) == fmt.MAGIC_PREFIX:
                f.seek(0)
                try:
                    read = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}
                    shape, _, dtype = read[fmt.read_magic(f)](f)
                except (ValueError, KeyError):
                    return False
                return len(shape) == 1 and dtype == np.float32
            f.seek(0)
            line = f.readline(100)
    except OSError:
        return True  # unreadable: the write itself names the problem
    try:
        float(line)
    except ValueError:
        return False
    return True


def _first_and_rest(chunks: Iterator[Any]) -> Iterator[Any]:
    """`chunks` with its first item read now: the file's format is checked before torch loads."""
    first = next(chunks, None)
    return chunks if first is None else itertools.chain([first], chunks)


def _score_text(
    exported, chunks: Iterator[Any], labeled: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """Probabilities and labels (None: rows without a label column) of raw text rows."""
    from shardrec.trainer.inference.predict import rows_batch, score_batches

    probs, labels = [], []
    for (dense, ids), chunk_labels in chunks:
        p, _ = score_batches(
            exported.model,
            iter([rows_batch(dense, ids, exported.feature_names)]),
            exported.maps,
            exported.trained,
            exported.shared,
        )
        probs.append(p)
        labels.append(chunk_labels)
    if not probs:
        return np.zeros(0), np.zeros(0) if labeled else None
    return np.concatenate(probs), np.concatenate(labels) if labeled else None


def _score_events(exported, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """An event-log model on raw event rows: one probability per row (NaN for a row that is not a
    sample) and the samples' labels (NaN elsewhere)."""
    from shardrec.tools.preprocess.events.raw_events import event_row_batches
    from shardrec.trainer.inference.predict import score_batches

    rows, batches = event_row_batches(exported.header, exported.item_maps, path)
    probs, labels = np.full(rows, np.nan), np.full(rows, np.nan)
    for batch, where in batches:
        p, y = score_batches(exported.model, iter([batch]), trained=exported.trained)
        probs[where], labels[where] = p, y
    return probs, labels


def _can_score_as_missing(header: dict[str, Any], model: Path, events: bool) -> None:
    """Refuse --untrained-as-missing where it cannot act: a file that does not say which rows
    trained, an event log's model (its users and items have no missing-value row)."""
    from shardrec.trainer.inference.trained_rows import HEADER_KEY

    if HEADER_KEY not in header:
        fail(
            f"--untrained-as-missing: {model} was exported before model files recorded which rows "
            "trained; export the run again"
        )
    if events:
        fail(
            f"--untrained-as-missing: {model} is an event log's model, whose users and items are "
            "rows of their tables with no missing-value row; leave the events of users it never "
            "trained on out instead"
        )


def _flags_fit_the_input(
    input_path: Path, split: str | None, batch_size: int | None, no_label: bool
) -> None:
    """Refuse a flag that would do nothing with this input: --split and --batch-size choose a
    dataset's rows and their batches, --no-label reads raw rows (a dataset's rows hold labels)."""
    if input_path.is_dir():
        if no_label:
            fail(f"--no-label is for raw rows: {input_path} is a dataset, whose rows hold labels")
        return
    given = [f"--split {split}"] if split is not None else []
    given += [f"--batch-size {batch_size}"] if batch_size is not None else []
    if given:
        fail(
            f"{given[0]} is for a dataset directory: {input_path} is a file of raw rows, scored "
            "whole"
        )


def _a_dataset(directory: Path, model: Path) -> None:
    """Refuse a directory that is no dataset (nor one being written: Manifest.load says that),
    naming one of its files in the format of `model`'s rows: raw rows are scored a file at a
    time."""
    from shardrec.dataloader.format.manifest import MANIFEST
    from shardrec.dataloader.util.locks import WORK_DIR
    from shardrec.tools.preprocess.raw_rows import in_the_models_format
    from shardrec.trainer.inference.model_file import read_header

    if (directory / MANIFEST).exists() or (directory / WORK_DIR).exists():
        return
    files = sorted(p for p in directory.iterdir() if p.is_file() and not p.name.startswith("."))
    # A file of the model's format first; another (a Parquet file for a text model) is named
    # where there is none: predict on it then says what the model reads.
    try:
        header = read_header(model)
        rows = [p for p in files if in_the_models_format(header, p)] or files
    except ValueError:
        rows = files  # the model file's own refusal comes once a file is named
    fix = f"name one of its files (e.g. {rows[0]})" if rows else "it holds no file"
    fail(
        f"{directory}: a directory but not a dataset (no {MANIFEST}); predict scores a dataset "
        f"directory or one file of raw rows: {fix}"
    )


def predict(
    model: Annotated[Path, typer.Argument(help="Model file from `shardrec export`.")],
    input_path: Annotated[
        Path,
        typer.Argument(
            metavar="INPUT",
            help="A dataset directory (with --split), or raw rows as the model's data was written (.gz too): "
            "by its feature spec (CSV with a header, quoted fields, lists, string categoricals) or Criteo's rows; "
            "for an event-log model, an event log (its listens with enough earlier events of their user are scored).",
        ),
    ],
    split: Annotated[
        str | None,
        typer.Option("--split", help="Split of a dataset directory to score (default: test)."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="Write probabilities here: .npy (float32) or text, one per line (default: stdout).",
        ),
    ] = None,
    batch_size: Annotated[
        int | None,
        typer.Option(
            help="Rows scored at a time (dataset input); default 8192, or 128 for an HSTU model "
            "(its attention grows with batch x history^2)."
        ),
    ] = None,
    no_label: Annotated[
        bool,
        typer.Option(
            "--no-label",
            help="Rows without labels, scored without an AUC: Criteo's rows without their "
            "label column (as its test.txt), or a spec model's rows with a header or in Parquet, "
            "whose label column may be missing or is read past; an event log is scored without "
            "an AUC (its played ratios are still read: earlier listens make the history).",
        ),
    ] = False,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json", help="Print rows and AUC (against the input's labels) as JSON; needs --out."
        ),
    ] = False,
    untrained_as_missing: Annotated[
        bool,
        typer.Option(
            "--untrained-as-missing",
            help="Score an id whose table row never trained (still at its initial random weights) "
            "as its feature's missing value: the out-of-vocabulary row in vocabulary mode, an empty "
            "field's row in hashing mode (a list leaves the id out). Without it such ids are "
            "scored as they are, and counted per table.",
        ),
    ] = False,
) -> None:
    """Score a preprocessed split or raw rows with an exported model, in one process (no torchrun).

    Raw rows are read by the model's feature spec (or Criteo's schema) and get its data's own
    transform (its hashing or vocabulary and dense transform)."""
    # The flags and paths before torch is imported.
    if json_out and out is None:
        fail("--json prints a summary: give --out for the probabilities")
    if batch_size is not None and batch_size < 1:
        fail(f"--batch-size must be at least 1, got {batch_size}")
    if out is not None and out.is_file() and out.stat().st_size and not _holds_predictions(out):
        fail(
            f"--out {out}: exists and is not a file of probabilities `shardrec predict` wrote, so "
            "it is kept; give another file name, or remove it first"
        )
    if model.is_dir():
        from shardrec.trainer.rundir import names

        run = (model / names.CONFIG).is_file()
        fail(
            f"{model}: a {'run ' if run else ''}directory, not a model file; "
            + (
                f"export it first: `shardrec export {model} --out model.safetensors`"
                if run
                else "make one with `shardrec export RUN --out FILE`"
            )
        )
    if not input_path.exists():
        fail(f"{input_path}: no such file or dataset directory")
    if input_path.is_file() and input_path.stat().st_size == 0:
        fail(f"{input_path}: empty (no rows): nothing to score")
    if input_path.is_dir():
        _a_dataset(input_path, model)
    _flags_fit_the_input(input_path, split, batch_size, no_label)
    split = split or "test"
    from shardrec.dataloader.format.manifest import DatasetError
    from shardrec.trainer.inference.model_file import read_header

    try:
        # The model's header and the file's first rows are read before torch is imported: a file
        # in another format is refused in a second.
        header = read_header(model)
        events = bool(header.get("transform", {}).get("events_spec"))  # an event-log model
        if untrained_as_missing:
            _can_score_as_missing(header, model, events)
        raw = None
        if not input_path.is_dir() and not events:
            from shardrec.tools.preprocess.raw_rows import RawRows

            raw = RawRows(header, model)
            chunks = _first_and_rest(raw.read(input_path, labeled=not no_label))
        from shardrec.trainer.inference.predict import load_exported, score_split, split_batch

        exported = load_exported(model)
        if exported.trained is not None:
            exported.trained.as_missing = untrained_as_missing
        if input_path.is_dir():
            batch_size = batch_size or split_batch(header)
            probs, labels = score_split(exported, input_path, split, batch_size)
        elif exported.item_maps is not None:
            # An event log's labels are its listens' own played ratios, which the log must hold
            # (the history's listen-plus and skips come from them); --no-label scores the log
            # without an AUC all the same, as it does other rows (a log of listens still to come).
            probs, labels = _score_events(exported, input_path)
            labels = None if no_label else labels
        else:
            probs, labels = _score_text(exported, chunks, labeled=not no_label)
    except (ValueError, DatasetError) as e:
        fail(str(e))
    if not len(probs):  # a compressed file of nothing, a header alone, an empty split
        where = f"split {split!r} of {input_path}" if input_path.is_dir() else str(input_path)
        fail(f"{where}: no rows: nothing to score")
    from shardrec.trainer.loop.metrics import auc

    try:
        _write(probs, out)
    except OSError as e:
        fail(f"{out}: cannot write the probabilities ({e.strerror or e})")
    sample = ~np.isnan(probs)  # an event log's rows that are not samples have no probability
    result = {
        "rows": int(len(probs)),
        "auc": None
        if labels is None
        else auc(probs[sample], labels[sample])
        if sample.any()
        else float("nan"),
        "out": str(out) if out else None,
    }
    if input_path.is_dir():
        result["batch_size"] = batch_size  # rows scored at a time
    if not sample.all():
        result["samples"] = int(sample.sum())
    result["untrained"] = exported.trained.summary() if exported.trained is not None else None
    if exported.shared is not None:  # a model of managed tables: the ids they had no slot for
        result["shared_row"] = exported.shared.summary()
    cut = _lists_cut(raw, input_path, len(probs), json_out)
    if cut:
        result["lists_cut"] = cut
    if json_out:
        print_json(result)
    elif out is not None:
        from shardrec.trainer.rundir.metrics_log import auc_text

        measured = {"auc": result["auc"], "samples": int(sample.sum())}
        scored = (
            "no labels, no AUC"
            if labels is None
            else f"AUC against the input's labels {auc_text(measured, 6)}"
        )
        samples = (
            f", {result['samples']:,} of them samples: the rest are nan"
            if "samples" in result
            else ""
        )
        err_console.print(
            f"wrote {result['rows']:,} probabilities to {out} ({scored}{samples})", highlight=False
        )
    if not json_out:
        from shardrec.trainer.inference.shared_row import shared_row_lines
        from shardrec.trainer.inference.trained_rows import untrained_lines

        lines = untrained_lines(exported.trained, str(model))
        for line in lines + shared_row_lines(exported.shared, str(model)):
            err_console.print(line, highlight=False, soft_wrap=True)


def _lists_cut(raw, input_path: Path, rows: int, json_out: bool) -> dict[str, dict[str, int]]:
    """The raw rows' list columns cut at max_length, as preprocessing cuts them (what the model was
    trained on): a warning for each on stderr (none with --json), and their counts."""
    from dataclasses import asdict

    from shardrec.tools.preprocess.tasks.bad_rows import list_cut_lines, lists_cut

    cuts = lists_cut([raw.lists_cut]) if raw is not None else {}
    then = "scored on the values preprocessing keeps, as the model was trained"
    for line in [] if json_out else list_cut_lines(cuts, rows, then):
        err_console.print(f"warning: {input_path}: {line}", highlight=False, soft_wrap=True)
    return {name: asdict(c) for name, c in cuts.items()}


def register(app: typer.Typer) -> None:
    app.command()(predict)
