"""What the bench commands share: the --json flag, one way to show a result, one line per bad or
unused option, and one line for a stop."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Annotated, Any

import typer

from shardrec.tools.cli.common import fail, interrupted, print_json, sigterm_as_ctrl_c

JsonFlag = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]


def show(result: dict, json_out: bool, printer: Callable[[dict], None]) -> None:
    """The benchmark's figures as JSON (--json) or as its own table."""
    if json_out:
        print_json(result)
    else:
        printer(result)


def at_least(option: str, value: int, minimum: int, why: str = "") -> None:
    """One line naming `option` if `value` is under `minimum` (`why`: what the minimum means)."""
    if value < minimum:
        fail(f"{option} {value}: must be >= {minimum}{f' ({why})' if why else ''}")


def positive(option: str, value: float) -> None:
    """One line naming `option` if `value` (a size, a share) is not a finite number above 0
    (typer takes nan and inf for a float)."""
    if not 0 < value < math.inf:
        fail(f"{option} {value:g}: must be a finite number > 0")


def given(ctx: typer.Context, *names: str) -> list[str]:
    """The options among `names` (parameter names) given on the command line, as flags."""
    given = [n for n in names if ctx.get_parameter_source(n).name != "DEFAULT"]
    return ["--" + n.replace("_", "-") for n in given]


def refuse_unused(ctx: typer.Context, names: tuple[str, ...], context: str) -> None:
    """One line naming the first option given that does nothing in `context`."""
    for flag in given(ctx, *names):
        fail(f"{flag} does nothing {context}: leave it out")


def stops_in_one_line(command: Callable[..., Any]) -> Callable[..., Any]:
    """The bench command `command`, stopped by Ctrl-C or a kill (SIGTERM) as bench preprocess is:
    its runs' `finally` blocks remove their temporary folders and end their child processes
    (proctree.run_to_end), then interrupted()'s one line says that nothing was measured, exit
    code 130 (143 for a kill)."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            with sigterm_as_ctrl_c():
                return command(*args, **kwargs)
        except KeyboardInterrupt:
            interrupted("nothing measured")

    return run
