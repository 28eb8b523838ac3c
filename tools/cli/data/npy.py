"""`shardrec data import-npy | export-npy | reference-npy`: torchrec's `day_N_*.npy` layout in and
out, and the MLPerf DLRMv2 reference's preprocessing of Criteo 1TB day files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardrec.dataloader.format.manifest import DatasetError
from shardrec.tools.cli.common import fail, interrupted, print_json
from shardrec.tools.console import console
from shardrec.tools.preprocess.derived import npy_import_export


def import_npy(
    src: Annotated[
        Path, typer.Argument(help="Directory of torchrec's day_N_{dense,sparse,labels}.npy files.")
    ],
    out: Annotated[Path, typer.Option(help="Output dataset directory: new, or an empty one.")],
    max_ids: Annotated[
        str | None,
        typer.Option(
            help="torchrec's hashes: N or N1,N2,... (ids = value % N); default max id + 1."
        ),
    ] = None,
    val_half: Annotated[
        str | None,
        typer.Option(
            help="Which half of the last day is validation: first (torchrec's, and what "
            "`data export-npy` writes; the default) or second.",
            show_default=False,
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Import data preprocessed by torchrec's scripts, with torchrec's splits and ids."""
    if val_half not in (None, "first", "second"):
        fail(f"--val-half {val_half!r} must be first or second")
    try:
        hashes = [int(v) for v in max_ids.split(",")] if max_ids else None
    except ValueError:
        fail(f"--max-ids {max_ids}: expected an integer or a comma-separated list of integers")
    try:
        manifest = npy_import_export.import_npy(src, out, hashes, val_half)
    except npy_import_export.MaxIdsError as e:
        fail(f"--max-ids {max_ids}: {e}")
    except (ValueError, DatasetError) as e:
        fail(str(e))
    except OSError as e:  # e.g. no space or no permission beside --out
        fail(f"{e.filename or out}: {e.strerror or e}")
    except KeyboardInterrupt:  # Ctrl-C, or a kill (the entry point's sigterm_as_ctrl_c)
        interrupted(
            f"{out}: nothing written (the dataset is written in a temporary folder beside it, "
            "now removed); rerun the same command"
        )
    rows = {s: info.rows for s, info in manifest.splits.items()}
    if json_out:
        print_json({"rows": rows})
    else:
        console.print(f"imported {_rows_text(rows)} into {out}", highlight=False)


def reference_npy(
    days: Annotated[
        list[Path],
        typer.Argument(
            help="Criteo 1TB day files in order, day_0 .. day_23 (the last: val + test), plain or .gz."
        ),
    ],
    out: Annotated[
        Path,
        typer.Option(
            help="Directory for day_N_{dense,sparse,labels}.npy (then `data import-npy`)."
        ),
    ],
    dense: Annotated[
        str,
        typer.Option(
            help="log3: log(x+3), the published arrays' (torchrec 0.3.2); log-min2: today's torchrec."
        ),
    ] = "log3",
    seed: Annotated[
        int, typer.Option(help="Seed of the one-time per-sample shuffle of the training days.")
    ] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Preprocess as the MLPerf DLRMv2 reference does (torchrec's Criteo scripts), in bounded
    memory.

    Dense transform, contiguous ids by first occurrence (frequency threshold 0), the per-sample
    shuffle of the training days: the same arrays, byte for byte. Restartable: a rerun of the same
    command keeps every file already written; one with other inputs, --seed or --dense is refused
    (OUT/reference-npy.json records what made the arrays). Memory: 8 bytes per training row for
    the shuffle's permutation (34 GB for Criteo 1TB), 16 bytes per (id, day) pair of the largest
    column for the ids."""
    from shardrec.tools.preprocess.derived.mlperf_reference import reference_preprocess

    missing = [str(d) for d in days if not d.is_file()]
    if missing:
        fail(f"{missing[0]}: no such day file")
    try:
        rows = reference_preprocess(days, out, dense=dense, seed=seed)
    except ValueError as e:
        fail(str(e))
    except OSError as e:  # e.g. no space or no permission under --out
        fail(f"{e.filename or out}: {e.strerror or e}")
    except KeyboardInterrupt:
        interrupted(f"{out}: the files written so far are kept; rerun the same command to finish")
    if json_out:
        print_json({"rows": rows})
    else:
        console.print(
            f"wrote {len(rows)} day file(s), {sum(rows):,} rows, to {out}", highlight=False
        )


def export_npy(
    directory: Annotated[
        Path, typer.Argument(help="Dataset directory (from `shardrec preprocess`).")
    ],
    out: Annotated[Path, typer.Option(help="Directory for day_N_{dense,sparse,labels}.npy.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Export to torchrec's day-file layout (train parts as days, then a last day of val + test)."""
    try:
        done = npy_import_export.export_npy(directory, out)
    except (ValueError, DatasetError) as e:
        fail(str(e))
    except KeyboardInterrupt:  # Ctrl-C, or a kill (the entry point's sigterm_as_ctrl_c)
        interrupted(
            f"{out}: the day files written so far are kept (none half-written), without "
            f"{npy_import_export.EXPORT_MARKER}, which is written last; rerun the same command"
        )
    if json_out:
        print_json(done.rows)
    else:
        halves = f"val {done.val_rows:,} rows, then test {done.test_rows:,}"
        console.print(
            f"wrote {len(done.rows)} day file(s) to {out}: {_rows_text(done.rows)} ({halves})",
            highlight=False,
        )


def _rows_text(rows: dict[str, int]) -> str:
    """{"train": 1000, "val": 256} -> "train 1,000 rows, val 256 rows"."""
    return ", ".join(f"{name} {n:,} rows" for name, n in rows.items())


def register(data_app: typer.Typer) -> None:
    data_app.command("import-npy")(import_npy)
    data_app.command("export-npy")(export_npy)
    data_app.command("reference-npy")(reference_npy)
