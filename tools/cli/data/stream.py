"""`shardrec data digest` and `shardrec data verify`: prove what a training stream contains."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import Progress, TextColumn

from shardrec.dataloader.digest import stream_digests
from shardrec.dataloader.format.integrity import verify
from shardrec.dataloader.format.manifest import DatasetError, Manifest
from shardrec.dataloader.format.source import check_dataset_dir
from shardrec.tools.cli.common import fail, print_json
from shardrec.tools.console import console, err_console
from shardrec.trainer.job.sections import TrainConfig


def digest(
    directory: Annotated[
        Path, typer.Argument(help="Dataset directory (shardrec format or torchrec day_N_*.npy).")
    ],
    seed: Annotated[int, typer.Option(help="Shuffle seed.")] = 0,
    global_batch: Annotated[
        int,
        typer.Option(
            "--global-batch",
            help="Samples per global batch (all ranks); the default is train.global_batch_size's.",
        ),
    ] = TrainConfig().global_batch_size,
    world_size: Annotated[
        int, typer.Option("--world-size", help="Ranks whose slices are concatenated.")
    ] = 1,
    batches: Annotated[int, typer.Option(help="Global batches to digest.")] = 10,
    start_batch: Annotated[int, typer.Option("--start-batch", help="First global batch.")] = 0,
    split: Annotated[str, typer.Option(help="Split to read.")] = "train",
    epoch: Annotated[int, typer.Option(help="Epoch (the shuffle differs per epoch).")] = 0,
    shuffle: Annotated[
        bool, typer.Option("--shuffle/--no-shuffle", help="Shuffle, or keep file order.")
    ] = True,
    tail: Annotated[str, typer.Option(help="Last partial global batch: drop or pad.")] = "drop",
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Print one SHA-256 per global batch, over the ranks' slices concatenated in rank order.

    The digests do not depend on --world-size: equal digests prove two runs, machines or
    cluster sizes see the same data in the same order.
    """
    if batches <= 0 or start_batch < 0 or world_size <= 0:
        fail(
            "--batches and --world-size must be positive and --start-batch not negative, "
            f"got {batches}, {world_size}, {start_batch}"
        )
    if epoch < 0:  # the loader's own refusal would reach the user as a traceback
        fail(f"--epoch must not be negative, got {epoch}")
    if (
        global_batch <= 0 or global_batch % world_size
    ):  # said with the flags, before the loader says it with its names
        fail(
            f"--global-batch {global_batch} does not divide by --world-size {world_size}"
            if global_batch > 0
            else f"--global-batch must be positive, got {global_batch}"
        )
    try:  # before torchrec's import (seconds): a wrong path is refused at once
        check_dataset_dir(directory)
    except DatasetError as e:
        fail(str(e))
    from shardrec.dataloader.loader import ShuffleSpec, build_loader

    try:
        loaders = [
            build_loader(
                directory,
                split,
                global_batch_size=global_batch,
                rank=r,
                world_size=world_size,
                shuffle=ShuffleSpec(enabled=shuffle, seed=seed),
                tail=tail,
                epoch=epoch,
            )
            for r in range(world_size)
        ]
    except ValueError as e:  # DatasetError is a ValueError: bad files or bad options
        fail(str(e))
    total = len(loaders[0])
    if start_batch >= total:
        fail(f"--start-batch {start_batch} is past the end: the epoch has {total} global batches")
    count = min(batches, total - start_batch)
    with Progress(
        *Progress.get_default_columns(),
        TextColumn("{task.fields[rate]}"),
        console=err_console,
        transient=True,
    ) as bar:
        task = bar.add_task("digesting", total=count, rate="")
        rows, started = [], time.perf_counter()
        try:
            for k, d in stream_digests(loaders, start_batch, batches):
                rows.append({"batch": k, "sha256": d})
                rate = len(rows) * global_batch / max(time.perf_counter() - started, 1e-9)
                bar.update(task, advance=1, rate=f"{rate:,.0f} samples/s")
        except DatasetError as e:  # found while reading: an id outside its table
            bar.stop()
            fail(str(e))
    if json_out:
        print_json(
            {
                "directory": str(directory),
                "split": split,
                "seed": seed,
                "epoch": epoch,
                "shuffle": shuffle,
                "global_batch": global_batch,
                "world_size": world_size,
                "batches_per_epoch": total,
                "digests": rows,
            }
        )
        return
    for row in rows:
        console.print(f"{row['batch']:>8}  {row['sha256']}", highlight=False)


def verify_cmd(
    directory: Annotated[Path, typer.Argument(help="Dataset directory (with manifest.json).")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Check every file's size and SHA-256 against the manifest; exit 1 on any problem."""
    try:
        manifest = Manifest.load(directory)
        problems = _verify_any(directory, manifest)
    except DatasetError as e:
        fail(str(e))
    repair = _repair_advice(directory, manifest) if problems else ""
    if json_out:  # what the text says: each problem, and how to repair them
        shown = {"directory": str(directory), "ok": not problems, "problems": problems}
        print_json({**shown, "repair": repair} if problems else shown)
    else:
        for p in problems:
            console.print(
                f"[red]problem:[/] {escape(p)}", highlight=False, soft_wrap=True, markup=True
            )
        if not problems:
            console.print(f"{directory}: every file matches its manifest checksum")
        else:
            console.print(repair, highlight=False, soft_wrap=True)
    if problems:
        raise typer.Exit(1)


def _repair_advice(directory: Path, manifest: Manifest) -> str:
    """How to write a damaged dataset's files again, by the command that made it (its manifest
    tells which). A rerun of `shardrec preprocess` redoes only the tasks whose parts are missing or
    of another size, so a changed byte (the same size) is redone once its file is removed; the
    copies' commands write into a new folder only."""
    intro = f"to repair {directory}"
    multihot = manifest.options.get("multihot")
    if manifest.kind == "events":
        return (
            f"{intro}, re-run the `shardrec preprocess --events` that made it, into it, with the "
            "same inputs and event spec: it writes every file again"
        )
    if isinstance(multihot, dict):
        return (
            f"{intro}, write it again into a new folder: `shardrec data multihot "
            f"{multihot.get('source', 'SRC')} --out NEW` with the settings its manifest's "
            "options.multihot records"
        )
    if manifest.options.get("source") == "torchrec-npy":
        return (
            f"{intro}, import it again into a new folder: `shardrec data import-npy SRC --out NEW`"
        )
    return (
        f"{intro}, remove the files named above, then re-run the `shardrec preprocess` that made "
        "it, into it, with the same inputs and options: it writes them again"
    )


def _verify_any(directory: Path, manifest: Manifest) -> list[str]:
    """verify's problems; an event-log dataset's files by size and SHA-256 (its parts, item maps
    and timelines), and its parts opened as the loader opens them."""
    from shardrec.dataloader.events.event_files import events_info, verify_files

    if manifest.kind == "events":
        return verify_files(Path(directory), events_info(manifest, Path(directory)))
    return verify(directory)


def register(data_app: typer.Typer) -> None:
    data_app.command("digest")(digest)
    data_app.command("verify")(verify_cmd)
