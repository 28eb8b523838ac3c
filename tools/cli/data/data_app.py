"""`shardrec data ...`: inspect, verify and digest a preprocessed dataset."""

from __future__ import annotations

import typer

from shardrec.tools.cli.data import multihot as cli_data_multihot
from shardrec.tools.cli.data import stats as cli_data_inspect
from shardrec.tools.cli.data import stream as cli_data_stream

data_app = typer.Typer(
    help=(
        "Inspect, check and convert a preprocessed dataset: statistics, rows, checksums, stream digests, "
        "torchrec's .npy layout, multi-hot copies."
    ),
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    # Each module below adds its commands to data_app.
    cli_data_stream.register(data_app)
    cli_data_inspect.register(data_app)
    cli_data_multihot.register(data_app)
    app.add_typer(data_app, name="data")
