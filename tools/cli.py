"""The `shardrec` command: one typer app composed of one module per command group."""

from __future__ import annotations

from typing import Annotated

import typer

from shardrec.tools import cli_plan, cli_synth
from shardrec.tools import cli_preprocess
from shardrec.tools import cli_data
from shardrec.tools import cli_bench
from shardrec.tools import cli_train
from shardrec.tools import cli_report
from shardrec.tools.cli_common import configure_logging

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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
