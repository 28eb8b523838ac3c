"""The `shardrec` command: one typer app composed of one module per command group."""

from __future__ import annotations

import functools
import importlib
from typing import Annotated, Any

import typer
import typer.core
import typer.main

from shardrec.tools.cli.common import configure_logging

# The commands in the order a user meets them (`shardrec --help` lists them so), each with the
# module under shardrec.tools.cli whose `register(app)` adds it. A module is imported only when
# its command runs (or `--help` lists it): `shardrec runs` must not pay for torch or numba.
COMMANDS = {
    "synth": "synth",
    "spec": "spec",
    "preprocess": "preprocess",
    "data": "data.data_app",
    "plan": "plan",
    "train": "train",
    "eval": "eval",
    "export": "export",
    "predict": "predict",
    "runs": "runs",
    "report": "report",
    "config": "config_cmd",
    "bench": "bench",
}
VERBOSE = ("-v", "--verbose")


class _LazyCommands(typer.core.TyperGroup):
    def list_commands(self, ctx: typer.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any:
        return _load_command(cmd_name) if cmd_name in COMMANDS else None

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        # -v after the command too (no command has a -v of its own): moved before it.
        cut = args.index("--") if "--" in args else len(args)
        verbose = [a for a in args[:cut] if a in VERBOSE]
        rest = [a for a in args[:cut] if a not in VERBOSE]
        return super().parse_args(ctx, [*verbose, *rest, *args[cut:]])


@functools.cache
def _load_command(name: str) -> Any:
    module = importlib.import_module(f"shardrec.tools.cli.{COMMANDS[name]}")
    holder = typer.Typer(pretty_exceptions_enable=False, add_completion=False)
    module.register(holder)
    return typer.main.get_group(holder).commands[name]


_type_in_help = typer.core.TyperOption.display_type_rich


def _flag_without_type(option: typer.core.TyperOption, ctx: typer.Context) -> str | None:
    """typer shows `<bool>` beside every flag in --help, though a flag takes no value: shown
    blank."""
    return None if option.is_flag else _type_in_help(option, ctx)


typer.core.TyperOption.display_type_rich = _flag_without_type  # type: ignore[method-assign]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"shardrec {version('shardrec')}")
        raise typer.Exit()


app = typer.Typer(
    cls=_LazyCommands,
    name="shardrec",
    help=(
        "Train DLRM-family recommendation models whose embedding tables are sharded across "
        "devices.\n\nThe flow: `synth` click logs (or bring your own: `spec infer` describes them), "
        "`preprocess` them into a dataset, `plan` how tables are sharded, `train` with torchrun, then `eval`, "
        "`export` and `predict`; `data` and `bench` inspect and measure."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    configure_logging(verbose)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
