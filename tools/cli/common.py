"""What every CLI command shares: one way to fail, print JSON and configure logging."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from shardrec.dataloader.files import atomic_open

console = Console()
err_console = Console(stderr=True)


def fail(message: str) -> NoReturn:
    """End a command on bad user input: one clear line on stderr, exit code 1."""
    # The message is text, not markup: "[trian]" in it must print as written.
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def save_figure(fig: Any, path: Path, dpi: int = 100) -> None:
    """Write a matplotlib figure to `path` (a PNG) atomically (dataloader/files.py); close it.

    An unwritable path (no permission, a file where a folder should be, a full disk) ends the
    command with `fail()` naming the path and the reason, not a traceback.
    """
    import matplotlib.pyplot as plt

    try:
        with atomic_open(path) as f:
            fig.savefig(f, format="png", dpi=dpi)
    except OSError as e:
        fail(f"{path}: cannot write the figure ({e.strerror or e})")
    finally:
        plt.close(fig)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def configure_logging(verbose: bool = False) -> None:
    """shardrec's own loggers at INFO (DEBUG with -v); other libraries' at WARNING, since
    fbgemm and torchrec log routine start-up details to the root logger."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    logging.getLogger("shardrec").setLevel(logging.DEBUG if verbose else logging.INFO)
