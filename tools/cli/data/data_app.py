"""`shardrec data ...`: inspect, verify and digest a preprocessed dataset."""

from __future__ import annotations

import typer

from shardrec.tools.cli.data import multihot, npy, stats, stream

data_app = typer.Typer(
    help=(
        "Inspect, check and convert a preprocessed dataset: statistics, rows, checksums, stream digests, "
        "torchrec's .npy layout, multi-hot copies."
    ),
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    # Each module below adds its commands to data_app.
    stream.register(data_app)
    stats.register(data_app)
    npy.register(data_app)
    multihot.register(data_app)
    app.add_typer(data_app, name="data")
