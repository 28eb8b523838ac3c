"""`shardrec spec ...`: propose a feature spec for a click log, show a dataset's."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardrec.dataloader.format.manifest import DatasetError, Manifest
from shardrec.dataloader.util.files import atomic_write_bytes
from shardrec.tools.cli.common import fail
from shardrec.tools.console import console, err_console

spec_app = typer.Typer(
    help="Feature specs (TOML): which column is the label, which are dense, categorical or lists, and the "
    "text's format. `preprocess --spec FILE` reads one.",
    no_args_is_help=True,
)


def infer(
    file: Annotated[
        Path, typer.Argument(help="A click log (CSV or TSV, .gz too, or a Parquet file).")
    ],
    label: Annotated[
        str,
        typer.Option(
            help="The label column: its header name or field index (0 is the first), with an optional threshold "
            "for numbers that are not 0/1, e.g. 'rating>=4'."
        ),
    ],
    out: Annotated[
        Path | None, typer.Option(help="Write the spec here (default: print it).")
    ] = None,
    rows: Annotated[
        int, typer.Option(min=2, help="Rows read to decide: the first ones (of text or Parquet).")
    ] = 10_000,
    force: Annotated[
        bool, typer.Option("--force", help="Replace --out if it exists (an edited spec is lost).")
    ] = False,
) -> None:
    """Propose a spec from the first rows: format, each column's role, list separators, hash sizes.

    Each choice is a comment beside its column: check them, edit, then `shardrec preprocess FILE
    --spec SPEC`.
    """
    from shardrec.dataloader.spec.spec_file import spec_to_toml
    from shardrec.tools.preprocess.infer.parquet_infer import infer_parquet_spec
    from shardrec.tools.preprocess.infer.spec_infer import infer_spec, sample_lines
    from shardrec.tools.preprocess.parse.parquet_rows import file_rows
    from shardrec.tools.preprocess.parse.parquet_schema import is_parquet

    if file.is_dir():
        files = sorted(p.name for p in file.iterdir() if p.is_file() and not p.name.startswith("."))
        example = f" (e.g. {file / files[0]})" if files else ""
        fail(f"{file}: a directory; spec infer reads one file: name one of its files{example}")
    if not file.is_file():
        fail(f"{file}: no such file")
    if out is not None and out.exists() and not force:
        fail(f"{out}: exists (edits made to it would be lost); pass --force to replace it")
    advice: list[str] = []
    try:
        if is_parquet(file):
            spec, notes, advice = infer_parquet_spec(file, label, rows)
            total = file_rows(file)
            read, whole = min(rows, total), rows >= total
        else:
            spec, notes, advice = infer_spec(file, label, rows)
            lines, whole = sample_lines(file, rows)
            read = len(lines) - int(spec.format.header)
    except (ValueError, OSError) as e:
        fail(str(e))
    sample = f"its {read:,} rows (the whole file)" if whole else f"its first {read:,} rows"
    if not _has_table(spec):  # plan and train would refuse the data it makes
        advice = [*advice, _no_table_advice(spec)]
    preamble = (
        f"Feature spec proposed by `shardrec spec infer {file.name} --label '{label}'` from {sample}.\n"
        "Check each column's role (label, dense, categorical, list, ignore) and keys; the README's\n"
        '"Feature spec reference" lists them all. Then: shardrec preprocess FILE --spec THIS --out DIR'
    )
    text = spec_to_toml(spec, notes, "\n".join([preamble, *advice]))
    for line in advice:  # guesses a wrong one of which would train without a word
        err_console.print(f"warning: {file}: {line}", highlight=False, markup=False, soft_wrap=True)
    if out is None:
        console.print(text, end="", highlight=False, markup=False, soft_wrap=True)
        return
    try:
        atomic_write_bytes(out, text.encode())
    except OSError as e:
        fail(f"{out}: cannot write the spec ({e.strerror or e})")
    console.print(f"wrote {out}: {len(spec.columns)} columns ({_summary(spec)})", highlight=False)


def _summary(spec) -> str:
    roles = [c.role for c in spec.columns]
    return ", ".join(
        f"{roles.count(r)} {r}" for r in ("dense", "categorical", "list", "ignore") if r in roles
    )


def show(
    dataset: Annotated[
        Path,
        typer.Argument(
            help="A preprocessed dataset directory (with manifest.json), or a run directory: the "
            "spec of the data it trained on last, which it keeps when that data is gone."
        ),
    ],
) -> None:
    """Print the spec a dataset was preprocessed with (the built-in Criteo spec where none was
    given).

    It is the spec as applied: each hashed feature's table rows (--max-ids) are its hash_size, so
    `shardrec preprocess INPUTS --spec THIS` makes the same parts; a comment first names the
    options that changed the bytes but that a spec cannot hold (--min-count, --raw-ids, --float16,
    ...), to pass again. An event-log dataset (preprocess --events) shows its event spec.
    """
    from shardrec.dataloader.spec.feature_spec import SpecError
    from shardrec.dataloader.spec.spec_file import applied_spec

    try:
        manifest = Manifest.load(dataset)
        if manifest.kind == "events":
            _show_event_spec(dataset, manifest)
            return
        spec = applied_spec(manifest, dataset)
    except DatasetError as e:
        _show_run_spec(dataset, str(e))
        return
    except SpecError as e:
        fail(str(e))
    if spec is None:
        fail(f"{dataset}: made without `shardrec preprocess` (no spec recorded)")
    _print_spec(spec, manifest.options)


def _show_run_spec(run_dir: Path, not_data: str) -> None:
    """`spec show RUN`: the spec of the data the run trained on last, from RUN/dataset.json;
    `not_data`: the error of RUN read as a dataset, said where it is no run directory either."""
    from shardrec.dataloader.spec.feature_spec import SpecError
    from shardrec.trainer.rundir.life.trained_data import run_data_spec

    try:
        found = run_data_spec(run_dir)
    except SpecError as e:
        fail(str(e))
    if found is None:
        fail(not_data)
    spec, record = found
    if spec is None:
        fail(
            f"{run_dir}: its data ({record.get('path')}) was preprocessed without a feature spec "
            "(Criteo's built-in columns), or the run's record of it keeps none: `shardrec spec "
            "show DATA` shows a dataset's"
        )
    trained = f"The spec of the data {run_dir} trained on last ({record.get('path')})."
    _print_spec(spec, record.get("preprocessing", {}), [trained])


def _print_spec(spec, options: dict, notes: list[str] | None = None) -> None:
    """The spec as TOML, after the notes on what it cannot hold (`options`: the preprocessing
    options it was applied with)."""
    from shardrec.dataloader.spec.spec_file import spec_to_toml
    from shardrec.tools.preprocess.settings import flags_to_repeat

    notes = list(notes or [])
    flags = flags_to_repeat(options, spec)
    if flags:
        notes.append(
            "Preprocessed with options a spec cannot hold: to make the same dataset, pass them "
            f"again with --spec THIS:\n  {' '.join(flags)}"
        )
    source = options.get("multihot", {}).get("source")
    if source:
        notes.append(
            f"A multi-hot copy of {source}: this spec makes that source; `shardrec data "
            "multihot` makes the copy from it."
        )
    text = spec_to_toml(spec, preamble="\n".join(notes))
    console.print(text, end="", highlight=False, markup=False, soft_wrap=True)


def _show_event_spec(dataset: Path, manifest: Manifest) -> None:
    """An event-log dataset's event spec (preprocess --events SPEC), as its manifest keeps it."""
    from shardrec.dataloader.spec.event_spec_file import event_spec_from_dict, event_spec_to_toml

    recorded = manifest.events.get("spec")
    if not recorded:
        fail(f"{dataset}: an event-log dataset whose manifest records no event spec")
    spec = event_spec_from_dict(recorded, f"{dataset / 'manifest.json'}: events.spec")
    path = manifest.options.get("events_spec")
    made = f"`shardrec preprocess --events {path}`" if path else "`shardrec preprocess --events`"
    notes = [f"The event spec {dataset} was made with ({made})."]
    if spec.items:
        where = f" ({Path(path).parent})" if path else ""
        notes.append(
            f"Its item maps' files are found from the spec file's folder{where}: keep this there."
        )
    text = event_spec_to_toml(spec, preamble="\n".join(notes))
    console.print(text, end="", highlight=False, markup=False, soft_wrap=True)


def _has_table(spec) -> bool:
    """Whether a proposed spec has a column of ids (a categorical or a list: an embedding table)."""
    from shardrec.dataloader.spec.feature_spec import CategoricalColumn

    return any(isinstance(c, CategoricalColumn) for c in spec.columns)


def _no_table_advice(spec) -> str:
    """The line for a proposal without a column of ids, which plan and train refuse: its integer
    columns proposed dense are the ones to look at (names without `_id`, such as user, item)."""
    from shardrec.dataloader.spec.feature_spec import DenseColumn

    ints = [c.name for c in spec.columns if isinstance(c, DenseColumn) and c.type == "int"]
    which = f" (here {', '.join(ints)}, proposed dense)" if ints else ""
    return (
        "no column proposed as categorical or list, so the model would have no embedding table "
        f"(plan and train refuse such data): a column of ids written as numbers{which} wants "
        'role = "categorical", kind = "integer" and a hash_size'
    )


def register(app: typer.Typer) -> None:
    spec_app.command()(infer)
    spec_app.command()(show)
    app.add_typer(spec_app, name="spec")
