"""A proposed feature spec from the first rows of a click log (`shardrec spec infer`).

What it decides, from up to `rows` lines (read with Python's csv module: this is a sample, not
the data path):

- the delimiter (tab, comma, semicolon or pipe: the one that cuts the lines into the most fields,
  the same number or nearly), quoting (on for CSV), and whether the first line is a header (a
  column that is numeric below a first value that is not);
- the label as given (`click`, or `rating>=4` for a threshold);
- each other column's role and hash size: column_infer.py's rules, which a Parquet file's columns
  go by too.

A Parquet file's spec is parquet_infer.py's, from its schema and these column rules; the label
column is label_infer.py's for both.

Every choice is written beside its column as a comment, for the user to check and edit. Guesses
which, if wrong, would train without a word come back as lines for the user too (the CLI
prints them and writes them on top of the spec): the integer columns of a file without a header,
dense from their values alone (codes read the same), and the words proposed as `[format] missing`
(`NA` among numbers, a MySQL dump's `\\N`: missing_infer.py), read as missing in every column.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path

from shardrec.dataloader.spec.feature_spec import (
    CategoricalColumn,
    Column,
    DenseColumn,
    FeatureSpec,
)
from shardrec.dataloader.spec.text_format import TextFormat
from shardrec.tools.preprocess.infer.column_infer import propose_column
from shardrec.tools.preprocess.infer.date_codes import date_codes, date_codes_advice
from shardrec.tools.preprocess.infer.label_infer import (
    is_comma_number,
    is_number,
    label_column,
    no_label_column,
    parse_label,
)
from shardrec.tools.preprocess.infer.missing_infer import find_missing_words
from shardrec.tools.preprocess.text.gz import open_text
from shardrec.tools.preprocess.text.lines import check_first_line, check_text, csv_fields

DELIMITERS = ("\t", ",", ";", "|")


def sample_lines(path: Path, rows: int) -> tuple[list[str], bool]:
    """The first `rows` + 1 lines of the file but those of spaces, tabs and carriage returns alone
    (a TSV's row of tabs tells nothing of its columns), and whether that was the whole file."""
    lines, whole = [], True
    with open_text(path) as f:
        for number, raw in enumerate(f, 1):
            if len(lines) > rows:
                whole = False
                break
            check_text(path, raw, number)
            lines.append(raw.decode("utf-8", "replace").rstrip("\r\n"))
    if lines:
        lines[0] = lines[0].lstrip("\ufeff")
    return [line for line in lines if line.strip(" \t\r")], whole


def _split(lines: list[str], delimiter: str) -> list[list[str]]:
    return csv_fields("\n".join(lines), delimiter)


def _delimiter(lines: list[str]) -> str:
    """The delimiter that cuts the first lines into the most fields, nearly the same number each;
    of two that tie, the one that cuts more lines into exactly that number: a semicolon CSV whose
    columns but one hold decimal commas (`1,5;2,25;1`) has as many commas as semicolons a row,
    but its header line has no comma."""
    best, score = "\t", (0.0, 0)
    for d in DELIMITERS:
        counts = Counter(len(r) for r in _split(lines[:200], d))
        common, seen = counts.most_common(1)[0]
        near = sum(n for c, n in counts.items() if abs(c - common) <= 3)
        if common > 1 and near >= 0.9 * sum(counts.values()) and (common * near, seen) > score:
            best, score = d, (common * near, seen)
    return best


def _has_header(rows: list[list[str]]) -> bool:
    first, rest = rows[0], rows[1:]
    for i, value in enumerate(first):
        below = [r[i] for r in rest if i < len(r) and r[i]]
        if (
            value
            and below
            and not is_number(value)
            and sum(map(is_number, below)) >= 0.9 * len(below)
        ):
            return True
    if any(is_number(v) for v in first):
        return False
    # No numeric column to tell: a header's names do not come back in the rows below.
    return all(sum(1 for r in rest if i < len(r) and r[i] == v) == 0 for i, v in enumerate(first))


def _unnamed_integers_advice(spec: FeatureSpec) -> str:
    """Without a header, the line naming the integer columns proposed dense from their values
    alone (a category written as a number reads the same), and what makes one a categorical;
    "" where there are none."""
    names = [c.name for c in spec.columns if isinstance(c, DenseColumn) and c.type == "int"]
    if spec.format.header or not names:
        return ""
    return (
        f"{', '.join(names)}: integer columns that no header names, proposed as dense numbers "
        "from their values alone; one that holds codes (a category written as a number, as "
        'Avazu\'s C14-C21 or banner_pos) wants role = "categorical", kind = "integer" and a '
        "hash_size instead"
    )


def _placed(column: Column, i: int, names: list[str]) -> Column:
    """A header name that cannot name a feature's file (`dense`, `a/b`, a repeated name) is renamed,
    and the column then found by its position."""
    name = column.name
    if name and name not in ("label", "dense") and not re.search(r"[/\\\0]|^\.|\.offsets$", name):
        if names.count(name) == 1:
            return column
    return dataclasses.replace(
        column, name=f"{re.sub(r'[^A-Za-z0-9_-]', '_', name) or 'c'}_{i}", position=i
    )


def _decimal_commas(columns: list[list[str]]) -> bool:
    """Numbers written with decimal commas (13,44): some column is all numbers that way, at least
    one with a comma (a semicolon CSV from a spreadsheet in many locales)."""
    for values in columns:
        if values and any("," in v for v in values) and all(map(is_comma_number, values)):
            return True
    return False


def _refuse_spaced_fields(path: Path, table: list[list[str]], delimiter: str, header: bool) -> None:
    """ValueError for a file written `a, b`: preprocessing reads fields as written (` price` is
    no column `price`, ` 3.45` no number)."""
    spaced = [r for r in table[:200] if len(r) > 1 and all(f.startswith(" ") for f in r[1:])]
    if (header and spaced and spaced[0] is table[0]) or len(spaced) * 2 >= len(table[:200]):
        d = {"\t": "\\t"}.get(delimiter, delimiter)
        raise ValueError(
            f"{path}: its fields start with a space after {delimiter!r} "
            f"({delimiter.join(spaced[0][:3])!r}); preprocessing reads each field as written, "
            f"so remove the spaces first, e.g. sed 's/{d} */{d}/g' {path} > clean{path.suffix}"
        )


def infer_spec(
    path: Path, label: str, rows: int = 10_000
) -> tuple[FeatureSpec, dict[str, str], list[str]]:
    """A spec for the file from its first `rows` rows, a note per column saying why, and lines
    for the user on guesses that values alone made (each naming its columns and the edit).

    label: the label column's header name or field index (0 for the first), with an optional
    `>=` threshold (`rating>=4`). ValueError names what does not fit.
    """
    lines, _ = sample_lines(path, rows)
    if len(lines) < 2:
        raise ValueError(f"{path}: {len(lines)} line(s): too few to infer a spec from")
    delimiter = _delimiter(lines)
    table = _split(lines, delimiter)
    header = _has_header(table)
    # A byte-order mark is read past above, but preprocess refuses one before a first row: the
    # spec proposed would not read the file it came from.
    check_first_line(path, header)
    _refuse_spaced_fields(path, table, delimiter, header)
    width = max(len(r) for r in table)
    names = [n.strip() for n in table[0]] if header else [f"c{i}" for i in range(width)]
    unnamed = width - len(names)  # fields past the header's names (a delimiter ending each row)
    names += [""] * unnamed
    body = table[1:] if header else table
    label_name, threshold = parse_label(label)
    if label_name not in names and label_name.isdigit() and int(label_name) < len(names):
        label_name = names[int(label_name)]
    values_of = [[r[i] for r in body if i < len(r) and r[i] != ""] for i in range(len(names))]
    if label_name not in names:
        raise no_label_column(path, label_name, names, None if header else values_of)
    quoting = delimiter == "," or any('"' in line for line in lines[:200])
    missing = find_missing_words(
        names, values_of, names.index(label_name), len(body), delimiter, quoting
    )
    values_of = [missing.values(values) for values in values_of]
    decimal = delimiter != "," and _decimal_commas(values_of)
    columns, notes, dated = [], {}, {}
    for i, name in enumerate(names):
        values = values_of[i]
        if decimal and values and all(map(is_comma_number, values)):
            values = [v.replace(",", ".") for v in values]
        if name == label_name:
            column, notes[name] = label_column(name, values, threshold, path)
            columns.append(column)
            continue
        column, note = propose_column(name, values, len(body), delimiter)
        if isinstance(column, CategoricalColumn) and (when := date_codes(values)) is not None:
            dated[name] = when
            note += f"; {when[0]} codes, {when[1]}: later ones are ids no row trained on"
        if i in missing.notes:
            note += f"; {missing.notes[i]}"
        if i >= width - unnamed:
            note += f"; the header names {width - unnamed} fields, the rows have {width}"
        if decimal and isinstance(column, DenseColumn) and column.type == "float":
            note += " (decimal commas: 13,44 is 13.44)"
        columns.append(_placed(column, i, names))
        notes[columns[-1].name] = note  # a renamed column's note goes above it too
    counts = [len(r) for r in body]
    fmt = TextFormat(
        "tsv" if delimiter == "\t" else "csv",
        delimiter,
        header,
        quoting,
        min(counts) if min(counts) < width else None,
        "," if decimal else None,
        missing=missing.words,
    )
    spec = FeatureSpec(fmt, tuple(columns))
    advice = [_unnamed_integers_advice(spec), missing.advice, date_codes_advice(dated, len(body))]
    return spec, notes, [line for line in advice if line]
