"""`shardrec data ...`: inspect, verify and digest a preprocessed dataset.

Each command's module is imported when the command runs (common.LazyGroup): `data stats` reads a
manifest and prints tables, and must not pay for `data multihot`'s compiled kernels.
"""

from __future__ import annotations

import typer

from shardrec.tools.cli.common import LazyGroup

# The commands in the order `shardrec data --help` lists them, each with the module under
# shardrec.tools.cli.data whose register(data_app) adds it, and its summary there.
MODULES = {
    "digest": "stream",
    "verify": "stream",
    "stats": "stats",
    "head": "stats",
    "import-npy": "npy",
    "export-npy": "npy",
    "reference-npy": "npy",
    "multihot": "multihot",
    "upgrade": "upgrade",
}
SUMMARIES = {
    "digest": "Print one SHA-256 per global batch, over the ranks' slices concatenated in rank "
    "order.",
    "verify": "Check every file's size and SHA-256 against the manifest; exit 1 on any problem.",
    "stats": "Rows per split, rows skipped by reason, per-feature statistics.",
    "head": "The first rows of a split, decoded: label, transformed dense values, sparse ids, "
    "named and ordered as the text's columns (the dataset's spec).",
    "import-npy": "Import data preprocessed by torchrec's scripts, with torchrec's splits and ids.",
    "export-npy": "Export to torchrec's day-file layout (train parts as days, then a last day of "
    "val + test).",
    "reference-npy": "Preprocess as the MLPerf DLRMv2 reference does (torchrec's Criteo scripts), "
    "in bounded memory.",
    "multihot": "Write a multi-hot copy of the one-hot dataset SRC, as MLPerf DLRMv2 does.",
    "upgrade": "Rewrite a dataset of the old layout in place as one file per part.",
}


class DataCommands(LazyGroup):
    package, modules, summaries = "shardrec.tools.cli.data", MODULES, SUMMARIES


data_app = typer.Typer(
    cls=DataCommands,
    help=(
        "Inspect, check and convert a preprocessed dataset: statistics, rows, checksums, stream digests, "
        "torchrec's .npy layout, multi-hot copies, upgrades of the old layout."
    ),
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
