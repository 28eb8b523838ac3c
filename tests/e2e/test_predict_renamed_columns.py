"""A file to score whose header names a column of the model's spec otherwise (`ZIP` for `zip`,
`item` for `movie_id`, `Rating` for the label `rating`): predict says so in one line, naming the
file, the column the model reads and what to rename. Before, a warning that the renamed column was
left out came first, then "the header has no column 'city' that the model's spec names (it has
click, City)", with no fix; a renamed label was "the header has no label column 'click'; rows
without labels? score them with --no-label"."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from helpers import assert_one_line_error, cli, cli_process
from test_spec_flow import write_untrained_model


def _model(tmp_path: Path, kind: str) -> Path:
    """A model of the spec (label `click`, categorical `city`, dense `n`) on a log of `kind`."""
    log = pa.table({"click": [0, 1] * 100, "city": ["paris", "oslo"] * 100, "n": [3, 5] * 100})
    if kind == "parquet":
        pq.write_table(log, tmp_path / "log.parquet")
    else:
        log.to_pandas().to_csv(tmp_path / "log.csv", index=False)
    (tmp_path / "s.toml").write_text(
        f'[format]\nkind = "{kind}"\n' + ("header = true\n" if kind == "csv" else "")
        + '[[columns]]\nname = "click"\nrole = "label"\n[[columns]]\nname = "city"\n'
        'role = "categorical"\nkind = "string"\nhash_size = 10\n'
        '[[columns]]\nname = "n"\nrole = "dense"\n'
    )  # fmt: skip
    cli("preprocess", tmp_path / f"log.{kind}", "--spec", tmp_path / "s.toml", "--out",
        tmp_path / "d")  # fmt: skip
    write_untrained_model(tmp_path / "d", tmp_path / "m.safetensors")
    return tmp_path / "m.safetensors"


def test_a_renamed_column_of_a_text_file_is_one_line_naming_what_to_rename(tmp_path: Path) -> None:
    model = _model(tmp_path, "csv")
    for header, says in (
        ("click,City,n", r"; rename its column 'City' to 'city'"),
        (
            "click,town,n",
            r" \(the model reads none of town\): name the column of its values 'city'",
        ),
    ):
        rows = tmp_path / "renamed.csv"
        rows.write_text(f"{header}\n1,oslo,3\n0,paris,5\n")
        for flags in ((), ("--no-label",)):
            assert_one_line_error(
                cli_process(["predict", str(model), str(rows), *flags], tmp_path, ok=False),
                rf"^error: {re.escape(str(rows))}: the file has no column 'city', which the "
                rf"model's spec reads by name{says}, as the training data named it$",
            )
    rows.write_text("Click,city,n\n1,oslo,3\n")
    assert_one_line_error(
        cli_process(["predict", str(model), str(rows)], tmp_path, ok=False),
        rf"^error: {re.escape(str(rows))}: the header has no label column 'click'; rename its "
        r"column 'Click' to 'click', as the training data named it \(rows without labels: score "
        r"them with --no-label\)$",
    )
    rows.write_text("click,town,size\n1,oslo,3\n")
    assert_one_line_error(
        cli_process(["predict", str(model), str(rows)], tmp_path, ok=False),
        r"no column 'city' \(and 1 more: n\), which the model's spec reads by name \(the model "
        r"reads none of town, size\): name the column of its values 'city'",
    )


def test_a_renamed_column_of_a_parquet_file_is_one_line_naming_what_to_rename(
    tmp_path: Path,
) -> None:
    model = _model(tmp_path, "parquet")
    renamed = tmp_path / "renamed.parquet"
    pq.write_table(pa.table({"click": [1, 0], "City": ["oslo", "paris"], "n": [3, 5]}), renamed)
    assert_one_line_error(
        cli_process(["predict", str(model), str(renamed)], tmp_path, ok=False),
        rf"^error: {re.escape(str(renamed))}: the file has no column 'city', which the model's "
        r"spec reads by name; rename its column 'City' to 'city', as the training data named it$",
    )
