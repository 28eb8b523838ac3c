"""`shardrec data stats` and `shardrec data head`: look inside a preprocessed dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from shardrec.dataloader.format.manifest import DatasetError, Manifest
from shardrec.tools.cli.common import fail, print_json
from shardrec.tools.cli.data.view import (
    SHARE_HEADERS,
    column_hex_width,
    dataset_stats,
    head_fields,
    head_rows,
    json_ids,
    plot_frequencies,
    raw_hex_widths,
    shown_value,
)
from shardrec.tools.console import console

HEAD_TABLE_ROWS = 50
"""Rows `data head` shows as a table (each a column of it); --json writes any number."""


def _table(title: str, records: list[dict]) -> Table:
    table = Table(title=title)
    if not records:
        return table
    for col in records[0]:
        table.add_column(
            str(col), justify="left" if col in ("split", "feature", "dtype", "list") else "right"
        )
    for r in records:
        table.add_row(
            *(
                f"{v:,.4g}"
                if isinstance(v, float)
                else f"{v:,}"
                if isinstance(v, int) and not isinstance(v, bool)
                else str(v)
                for v in r.values()
            )
        )
    return table


def stats(
    directory: Annotated[
        Path, typer.Argument(help="Dataset directory (from `shardrec preprocess`).")
    ],
    plot: Annotated[
        Path | None, typer.Option(help="Also write per-feature id-frequency curves to this PNG.")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Rows per split, rows skipped by reason, per-feature statistics."""
    try:
        result = dataset_stats(directory)
        if plot is not None:
            plot_frequencies(directory, plot)
    except DatasetError as e:
        fail(str(e))
    if json_out:
        print_json(
            {k: v for k, v in result.items() if k != "options"}
            | ({"plot": str(plot)} if plot else {})
        )
        return
    console.print(_table("splits", result["splits"]))
    console.print(
        _table("rows skipped", [{"reason": k, "rows": v} for k, v in result["skipped"].items()])
    )
    if result["lists_cut"]:
        cut = [
            {"list": k, "max_length": v["max_length"], "rows cut": v["rows"],
             "values left out": v["values"]}
            for k, v in result["lists_cut"].items()
        ]  # fmt: skip
        console.print(_table("lists cut at max_length", cut))
    # "table rows": embedding rows (the cardinality), not data rows; shares as percentages, one way.
    short = {"feature": "feature", "cardinality": "table rows", "dtype": "dtype", "mean_ids_per_sample": "mean ids",
             "p95_ids_per_sample": "p95 ids", "distinct_ids": "distinct ids"} | SHARE_HEADERS  # fmt: skip
    shares = tuple(SHARE_HEADERS)
    console.print(
        _table(
            "sparse features (train)",  # counted on the training split, as the planner reads them
            [
                {
                    v: (
                        f"{f[k]:.1%}"
                        if k in shares and isinstance(f.get(k), (int, float))
                        # raw 64-bit ids (preprocess --raw-ids): the table, not the data, sizes them
                        else "raw ids"
                        if k == "cardinality" and f.get(k) == 0
                        else ""
                        if f.get(k) is None  # no table: an event log's timestamps
                        else f.get(k, "")
                    )
                    for k, v in short.items()
                }
                for f in result["features"]
            ],
        )
    )
    console.print(_table("dense features (transformed, train)", result["dense"]))
    if plot is not None:
        console.print(f"wrote {plot}")


def head(
    directory: Annotated[
        Path, typer.Argument(help="Dataset directory (from `shardrec preprocess`).")
    ],
    n: Annotated[
        int,
        typer.Option(
            "--rows", "-n", help=f"Rows to show (the table shows {HEAD_TABLE_ROWS} at most)."
        ),
    ] = 5,
    split: Annotated[str, typer.Option(help="Split to read.")] = "train",
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the rows as JSON. Raw 64-bit ids (preprocess --raw-ids) are written as "
            "decimal strings, which JSON readers cannot round; other ids as numbers.",
        ),
    ] = False,
) -> None:
    """The first rows of a split, decoded: label, transformed dense values, sparse ids, named and
    ordered as the text's columns (the dataset's spec)."""
    if n < 0:
        fail(f"--rows must be >= 0, got {n}")
    try:  # every row asked for is read, and checked (a bad id is refused), shown or not
        rows = head_rows(directory, n, split)
    except DatasetError as e:
        fail(str(e))
    manifest = Manifest.load(directory)
    if json_out:
        print_json(json_ids(rows, manifest))
        return
    # A row is a column of the table: 100,000 of them made a 9 MB table no terminal shows.
    read, rows = len(rows), rows[:HEAD_TABLE_ROWS]
    # The title on a line of its own: as the table's, rich centred it over the table's width,
    # which an event-log dataset's histories make thousands of columns.
    console.print(f"{directory} {split}: first {len(rows)} rows", highlight=False)
    table = Table()
    table.add_column("field")
    for i in range(len(rows)):
        table.add_column(str(i), justify="right")
    hex_widths = raw_hex_widths(manifest, directory)
    for key, shown in head_fields(manifest, directory):
        width = hex_widths.get(key)
        if width is not None:
            width = column_hex_width(width, [r[key] for r in rows])
        table.add_row(
            shown + (" (raw, hex)" if width is not None else ""),
            *(shown_value(r[key], width) for r in rows),
        )
    console.print(table)
    if read > len(rows):
        console.print(
            f"the table shows the first {len(rows)} of the {read:,} rows read; "
            "--json prints them all",
            highlight=False,
        )


def register(data_app: typer.Typer) -> None:
    data_app.command()(stats)
    data_app.command()(head)
