"""The `shardrec` command's entry point: the console script's, and `python -m shardrec.tools.cli`'s.

A stop is one line from the command's first moment: the typer app's imports (typer, rich, click:
0.1-0.3 s) come after this module has taken SIGTERM as Ctrl-C, and a stop there says its line.
Before, a Ctrl-C there printed Python's traceback (exit status -2 or 130) and a kill ended the
command without a word (-15). Only the standard library is imported here (stops.py).
"""

from __future__ import annotations

import sys

from shardrec.tools.cli.stops import (
    COMMANDS,
    command_as_typed,
    ctrl_c_unwrapped,
    forget_a_handled_ctrl_c,
    sigterm_as_ctrl_c,
    stop_exit_code,
)


def main() -> None:
    """Run the `shardrec` command on sys.argv, SIGTERM taken as Ctrl-C from here to its end (one
    started with SIGTERM ignored keeps it so): every command, the ones that only read too, ends
    a kill in one line and exit code 143, its temporary files removed as a Ctrl-C removes them."""
    try:
        with sigterm_as_ctrl_c():
            try:
                with ctrl_c_unwrapped():
                    from shardrec.tools.cli.app import app
            except KeyboardInterrupt:  # nor rich, which prints the other lines
                typed = command_as_typed([], sys.argv[1:], COMMANDS)
                sys.stderr.write(f"interrupted: {typed} had not started: nothing written\n")
                raise SystemExit(stop_exit_code()) from None
            app()
    finally:
        forget_a_handled_ctrl_c()
