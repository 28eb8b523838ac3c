"""`shardrec data upgrade DIR`: rewrite a dataset of the old layout (a folder of `.npy` files per
part) in place as one file per part."""

from __future__ import annotations

import errno
import time
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from shardrec.dataloader.format.manifest import DatasetError
from shardrec.dataloader.util.files import PERMISSION_ERRNOS
from shardrec.tools.cli.common import fail, interrupted, print_json, sigterm_as_ctrl_c
from shardrec.tools.console import console, err_console
from shardrec.tools.preprocess.derived.dataset_upgrade import upgrade_dataset
from shardrec.tools.preprocess.derived.old_layout import load_old


def upgrade(
    directory: Annotated[Path, typer.Argument(help="Dataset directory (with manifest.json).")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Rewrite a dataset of the old layout in place as one file per part.

    A dataset of schema version 1 or 2 (a folder of .npy files per part) becomes one Arrow IPC
    file per part, every old file's checksum checked first. The old files stay until the new
    manifest is written (the disk holds both for a while); an interrupted run is finished by
    running the command again. The dataset keeps its fingerprint: runs trained on it resume."""
    try:
        old = load_old(directory)
        total = sum(s.rows for s in old[0].splits.values()) if old else 0
        start = time.perf_counter()
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed:,} rows"),
            TimeElapsedColumn(),
        )
        # a kill (SIGTERM) stops it as Ctrl-C does: the same line, the parts written kept
        with (
            sigterm_as_ctrl_c(),
            Progress(*columns, console=err_console, transient=True, disable=json_out) as bar,
        ):
            task = bar.add_task("upgrading", total=max(total, 1))
            result = upgrade_dataset(directory, on_part=lambda n: bar.update(task, advance=n))
    except OSError as e:
        if e.errno in PERMISSION_ERRNOS:
            _cannot_write(directory, e)
        fail(str(e))
    except (DatasetError, ValueError) as e:
        fail(str(e))
    except KeyboardInterrupt:
        interrupted(
            f"{directory}: nothing is lost (the old files stay until the new manifest is "
            "written, and the parts rewritten so far are kept); rerun the same command to finish"
        )
    seconds = time.perf_counter() - start
    if json_out:
        print_json({**vars(result), "seconds": round(seconds, 3)})
        return
    if result.from_version is None:
        console.print(f"{directory}: already one file per part (schema version 3); nothing to do")
        return
    console.print(
        f"{directory}: upgraded from schema version {result.from_version} to 3: {result.parts:,} "
        f"parts ({result.parts_written:,} written now), {result.rows:,} rows, "
        f"{result.bytes / 1e6:,.1f} MB in {seconds:.1f} s",
        highlight=False,
    )


def _cannot_write(directory: Path, e: OSError) -> NoReturn:
    """The rewrite is in place: a folder it may not write in (a read-only mount, another user's)
    is copied first, as the readers' refusal of the old layout says (manifest.upgrade_advice)."""
    why = "the folder is read-only" if e.errno == errno.EROFS else "no permission to write in it"
    fail(
        f"{directory}: cannot upgrade in place: {why} ({e.filename}); copy the dataset somewhere "
        "writable and rewrite the copy with `shardrec data upgrade COPY`"
    )


def register(data_app: typer.Typer) -> None:
    data_app.command("upgrade")(upgrade)
