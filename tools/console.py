"""The consoles every command prints through: results to stdout (`console`), errors and progress
to stderr (`err_console`). The CLI and the benchmarks both print here, so neither imports the
other for it."""

from __future__ import annotations

from rich.console import Console

console = Console()
err_console = Console(stderr=True)
