"""The `shardrec` command: one typer app composed of one module per command group."""

from __future__ import annotations

from typing import Annotated

import typer

from shardrec.tools.cli import bench as cli_bench, data as cli_data, plan as cli_plan
from shardrec.tools.cli import preprocess as cli_preprocess, report as cli_report, synth as cli_synth
from shardrec.tools.cli import train as cli_train
from shardrec.tools.cli import eval as cli_eval
from shardrec.tools.cli.common import configure_logging

app = typer.Typer(
    name="shardrec",
    help=(
        "Train DLRM-family recommendation models whose embedding tables are sharded across "
        "devices.\n\nThe flow: `synth` or `preprocess` raw click logs into a dataset, `plan` "
        "how tables are sharded, `train` with torchrun, and `data`/`bench` to inspect and measure."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root(verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False) -> None:
    configure_logging(verbose)


cli_synth.register(app)
cli_data.register(app)
cli_bench.register(app)
cli_plan.register(app)
cli_preprocess.register(app)
cli_train.register(app)
cli_report.register(app)
cli_eval.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
