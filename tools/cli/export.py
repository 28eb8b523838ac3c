"""`shardrec export RUN_DIR --out MODEL`: the run's checkpoint as one unsharded safetensors file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardrec.tools.cli.common import fail, interrupted, print_json
from shardrec.tools.console import console


def export(
    run_dir: Annotated[Path, typer.Argument(help="Run directory of `shardrec train`.")],
    out: Annotated[
        Path,
        typer.Option("--out", help="Model file to write (safetensors, e.g. model.safetensors)."),
    ],
    checkpoint: Annotated[
        int | None,
        typer.Option("--checkpoint", help="Step of the checkpoint (default: the newest)."),
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            "--data",
            help="The run's dataset where it is now, if it moved (default: the run's data.path, or "
            "for a checkpoint of an earlier stretch the data that stretch trained on); "
            "checked as `eval --data` checks it.",
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Write a run's checkpoint as one unsharded safetensors file.

    Every table is gathered from its shards, with the dense layers, the model config and the
    dataset's feature transform, into one file that `shardrec predict` (or any safetensors
    reader) loads without torchrun."""
    if out.is_dir():  # before torch is imported
        fail(f"--out {out}: is a directory; give a file name such as {out / 'model.safetensors'}")
    if out.is_file() and out.stat().st_size:
        from shardrec.trainer.inference.model_file import read_header

        try:  # an earlier export is replaced (a rerun); any other file is the user's
            read_header(out, complete=False)
        except ValueError:
            fail(
                f"--out {out}: exists and is not a model file of `shardrec export`, so it is kept; "
                "give another file name, or remove it first"
            )
    from shardrec.dataloader.format.manifest import DatasetError
    from shardrec.trainer.inference.export import export_model

    try:
        result = export_model(run_dir, out, checkpoint, data=data)
    except (ValueError, DatasetError) as e:
        fail(str(e))
    except OSError as e:
        fail(f"{out}: cannot write the model ({e.strerror or e})")
    except KeyboardInterrupt:
        kept = "the file there before is kept" if out.exists() else "nothing written"
        interrupted(f"{out}: {kept}; rerun the same command to export")
    if json_out:
        print_json(result)
    else:
        console.print(
            f"wrote {out}: step {result['step']}, {result['tables']} tables, {result['tensors']} tensors, "
            f"{result['bytes'] / 2**20:,.1f} MiB",
            highlight=False,
        )
        if result["untrained_rows"]:
            console.print(f"{out}: {result['untrained_rows']}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command()(export)
