"""The `shardrec` command: one typer app composed of one module per command group."""

from __future__ import annotations

from typing import Annotated

import typer
import typer.core

from shardrec.tools.cli import bench as cli_bench
from shardrec.tools.cli import config_cmd as cli_config
from shardrec.tools.cli import data as cli_data
from shardrec.tools.cli import eval as cli_eval
from shardrec.tools.cli import export as cli_export
from shardrec.tools.cli import plan as cli_plan
from shardrec.tools.cli import predict as cli_predict
from shardrec.tools.cli import preprocess as cli_preprocess
from shardrec.tools.cli import report as cli_report
from shardrec.tools.cli import runs as cli_runs
from shardrec.tools.cli import spec as cli_spec
from shardrec.tools.cli import synth as cli_synth
from shardrec.tools.cli import train as cli_train
from shardrec.tools.cli.common import configure_logging

# `shardrec --help` lists the commands in the order a user meets them; others follow.
FLOW = (
    "synth",
    "spec",
    "preprocess",
    "data",
    "plan",
    "train",
    "eval",
    "export",
    "predict",
    "runs",
    "report",
    "config",
    "bench",
)


class _FlowOrder(typer.core.TyperGroup):
    def list_commands(self, ctx: typer.Context) -> list[str]:
        names = list(self.commands)
        return [n for n in FLOW if n in names] + [n for n in names if n not in FLOW]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"shardrec {version('shardrec')}")
        raise typer.Exit()


app = typer.Typer(
    cls=_FlowOrder,
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
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    configure_logging(verbose)


cli_synth.register(app)
cli_spec.register(app)
cli_data.register(app)
cli_bench.register(app)
cli_plan.register(app)
cli_preprocess.register(app)
cli_train.register(app)
cli_report.register(app)
cli_eval.register(app)
cli_export.register(app)
cli_predict.register(app)
cli_runs.register(app)
cli_config.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
