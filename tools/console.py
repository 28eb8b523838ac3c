"""The consoles every command prints through: results to stdout (`console`), errors and progress
to stderr (`err_console`). The CLI and the benchmarks both print here, so neither imports the
other for it.

On a terminal they are as wide as the terminal. Output that is not a terminal (a pipe, a log
file, a test's capture) has no width to fit: rich would take 80 columns and cut a table's cells
(`1,000,…`); here tables keep their natural width and lines are not wrapped, so every number in a
log is whole.
"""

from __future__ import annotations

from rich.console import Console, ConsoleDimensions

NOT_A_TERMINAL_WIDTH = 100_000
"""Columns of output that is not a terminal: wider than any table or line printed, so none is cut
or wrapped (tables are drawn at their natural width, not stretched to it)."""


class _Console(Console):
    """rich's Console, unlimited in width where its output is not a terminal (decided at each
    print: sys.stdout may be replaced, as typer's CliRunner does). COLUMNS, which rich takes as
    the width of any output, counts for a terminal only: a log file cut at 80 columns is a log
    of cut numbers.

    Markup is off unless a print asks for it (`markup=True`, its values escaped): what is printed
    holds paths, column names and values as the user wrote them, and rich took `[old]` in
    `runs/exp[old]` or `[usd]` in a column `price[usd]` for a style tag, printing `runs/exp` and
    `price` without a word. Emoji codes are off too: rich printed `events.csv:100: ...` as
    `events.csv💯 ...`, the line number gone (`:100:` is an emoji's name)."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if not self.is_terminal:
            return ConsoleDimensions(NOT_A_TERMINAL_WIDTH, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size


console = _Console(markup=False, emoji=False)
err_console = _Console(stderr=True, markup=False, emoji=False)
