"""A proposed feature spec from the first rows of a click log (`shardrec spec infer`).

What it decides, from up to `rows` lines (read with Python's csv module: this is a sample, not
the data path):

- the delimiter (tab, comma, semicolon or pipe: the one that cuts the lines into the most fields,
  the same number or nearly), quoting (on for CSV), and whether the first line is a header (a
  column that is numeric below a first value that is not);
- each column's role: the label as given (`click`, or `rating>=4` for a threshold); a column empty
  in every row, or with a different long value in every row (a row id), is ignored; values cut by
  `|` or `;` (or `,` in a TSV) in many rows make a list; Unix times (seconds or milliseconds since
  1970, dated 2000-2100, under a time-like name or nearly all distinct) are ignored: a category of
  times would meet only new values in later data; integers make a dense column (log1p, or
  signed-log1p when negative), but for id-like names (`..._id`), the anonymised categoricals' `C<n>`
  names (Criteo's, Avazu's C14-C21) and codes with leading zeros; decimals a float dense column;
  fixed-width hex with letters, 8-16 digits (Criteo's, Avazu's ids), a hex categorical; anything
  else (an MD5's 32 digits too) a string categorical;
- hash sizes: twice an estimate of each categorical's distinct values (Chao1: the sample's
  distinct values plus the unseen ones its singletons suggest), within [16, 10,000,000]; where the
  sample saw nearly all of a column's values, raised to the smallest size (up to 8 times it) that
  gives each its own id (spec_hash_fit.py); where none does, the comment says how many share one.

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
import datetime
import math
import re
from collections import Counter
from pathlib import Path

from shardrec.dataloader.spec.feature_spec import (
    CategoricalColumn,
    Column,
    DenseColumn,
    FeatureSpec,
    IgnoredColumn,
    ListColumn,
    TextFormat,
)
from shardrec.tools.preprocess.infer.date_codes import date_codes, date_codes_advice
from shardrec.tools.preprocess.infer.label_infer import (
    is_comma_number,
    is_number,
    label_column,
    no_label_column,
    parse_label,
)
from shardrec.tools.preprocess.infer.missing_infer import find_missing_words
from shardrec.tools.preprocess.infer.spec_hash_fit import fit_hash_size
from shardrec.tools.preprocess.parse.parse_fields import INT64_MAX
from shardrec.tools.preprocess.text.gz import open_text
from shardrec.tools.preprocess.text.lines import check_first_line, check_text, csv_fields

DELIMITERS = ("\t", ",", ";", "|")
LIST_SEPARATORS = ("|", ";")
"""A list's separators in any text; a TSV's lists may be cut by commas too (a comma in a CSV of
another delimiter is text's: `Movie 2535, The (1965)` in a title)."""
MAX_HASH_SIZE = 10_000_000
_INT = re.compile(r"^-?[0-9]{1,19}$")
_WHOLE = re.compile(r"-?\d{1,19}\.0+$")
"""A whole number written with a zero fraction (66740.0), as pandas writes an integer column that
has nulls; a `kind = "integer"` column reads it as the integer (`260.0` accepted)."""
HEX = re.compile(r"^[0-9a-fA-F]+$")
MAX_HEX_DIGITS = 16
"""The widest value a hex categorical decodes (64 bits: parse_kernel.decode_hex); a wider one (an
MD5's 32 digits, a 19-digit id) is a string categorical, hashed from its bytes."""
# Words for the two values of a label column: which one is the click.
_ID_NAME = re.compile(r"(^|_)id$|Id$|ID$")
# Anonymised categoricals are named C1, C2, ... by convention (Criteo's C1-C26, Avazu's C1 and
# C14-C21).
_CATEGORY_NAME = re.compile(r"^C\d+$")
_TIME_NAME = re.compile(r"time|date|(^|_)ts$", re.IGNORECASE)
# Unix seconds from 2000-01-01 to 2100-01-01: a code of 9-10 digits in this range is a time.
_UNIX_SECONDS = (946_684_800, 4_102_444_800)


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


def is_integer(v: str) -> bool:
    """A value preprocessing reads as an integer: an optional '-' and up to 19 digits within
    +-INT64_MAX (parse_kernel.decode_int's rule)."""
    return bool(_INT.match(v)) and abs(int(v)) <= INT64_MAX


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


def hash_size(values: list[str], kind: str = "string") -> tuple[int, str]:
    """(hash_size, note) for a column of `kind` whose sample holds `values`: twice the estimate,
    raised where that would give some values seen one id (spec_hash_fit)."""
    counts = Counter(values)
    f1 = sum(1 for c in counts.values() if c == 1)
    f2 = sum(1 for c in counts.values() if c == 2)
    estimate = len(counts) + f1 * (f1 - 1) / (2 * (f2 + 1))
    size = int(min(max(16, 2 * estimate), MAX_HASH_SIZE))
    size = int(float(f"{size:.2g}")) if size > 100 else size  # two significant digits read better
    # Nearly every value seen (the estimate within 10% of them): sizes that part them are worth it.
    size, fit = fit_hash_size(counts, kind, size, complete=estimate <= 1.1 * len(counts))
    return (
        size,
        f"{len(counts):,} distinct among {len(values):,} values (~{math.ceil(estimate):,} "
        f"estimated){fit}",
    )


def _list_separator(values: list[str], delimiter: str) -> str | None:
    for sep in (*LIST_SEPARATORS, ",") if delimiter == "\t" else LIST_SEPARATORS:
        if sep != delimiter and sum(sep in v for v in values) >= 0.05 * len(values):
            return sep
    return None


def _unix_times(name: str, values: list[str]) -> str | None:
    """`2000-04-25 .. 2000-05-03` when every value is a Unix time in seconds or milliseconds and the
    column is named like a time or nearly every value is new; else None."""
    if _ID_NAME.search(name) or not all(map(is_integer, values)):
        return None
    numbers = [int(v) for v in values]
    low, high = min(numbers), max(numbers)
    scale = 1000 if low >= _UNIX_SECONDS[0] * 1000 else 1
    if not (_UNIX_SECONDS[0] * scale <= low and high < _UNIX_SECONDS[1] * scale):
        return None
    if not (_TIME_NAME.search(name) or len(set(numbers)) >= 0.5 * len(numbers)):
        return None
    epoch = datetime.datetime(1970, 1, 1)
    first, last = (epoch + datetime.timedelta(seconds=n // scale) for n in (low, high))
    return f"{first:%Y-%m-%d} .. {last:%Y-%m-%d}"


def _row_numbers(values: list[str]) -> bool:
    """The values count the rows from 0 or 1, as a pandas index written by to_csv does."""
    if not all(map(is_integer, values)) or values[0] not in ("0", "1"):
        return False
    first = int(values[0])
    return all(int(v) == first + i for i, v in enumerate(values))


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


def code_name(name: str) -> bool:
    """Whether a column's name says it holds codes: an id's (`_id`, `Id`, `ID`) or an anonymised
    categorical's (C<n>)."""
    return bool(_ID_NAME.search(name) or _CATEGORY_NAME.match(name))


def _whole_numbers(values: list[str]) -> tuple[list[str], bool]:
    """(values, whether any had a zero fraction), cut to integers where all are whole (66740.0):
    pandas writes an integer column that has nulls so, and judged as written, codes were a dense
    float where some rows were empty and a categorical where none was, a count a float."""
    cut = [v.split(".")[0] for v in values]
    whole = all(_WHOLE.match(v) or is_integer(v) for v in values) and all(map(is_integer, cut))
    return (cut, True) if whole and cut != values else (values, False)


def propose_column(
    name: str, values: list[str], rows: int, delimiter: str, integers: bool = False
) -> tuple[Column, str]:
    """The proposed column for the non-empty values of one column, and why. integers: the values
    are a Parquet integer column's, a categorical of them reads them as integers."""
    if not values:
        return IgnoredColumn(name), f"empty in all {rows:,} rows"
    written, values, zero_fraction = values, *_whole_numbers(values)
    dates = _unix_times(name, values)
    if dates is not None:
        unit = ", in milliseconds" if len(values[0]) > 11 else ""
        return IgnoredColumn(
            name
        ), f"Unix times{unit} ({dates}): later data holds only new values; derive an hour or a day"
    distinct = len(set(values))
    # A quantity with a fraction (a price of 15 decimals) differs in every row too: no row id.
    fractional = all(map(is_number, values)) and not all(v.lstrip("-").isdigit() for v in values)
    if distinct == len(values) >= 50 and min(map(len, values)) >= 10 and not fractional:
        return IgnoredColumn(name), "a different value in every row: a row id, not a feature"
    if distinct == len(values) >= 50 and _row_numbers(values):
        return IgnoredColumn(name), (
            f"the row's number ({values[0]}, {values[1]}, {values[2]}, ...; a pandas index?), "
            "not a feature"
        )
    numeric = all(map(is_number, values))
    sep = None if numeric else _list_separator(values, delimiter)
    if sep is not None:
        items = [i for v in values for i in v.split(sep) if i]
        longest = max(len([i for i in v.split(sep) if i]) for v in values)
        size, seen = hash_size(items)
        note = f"values cut by {sep!r}, up to {longest} in a row; {seen}; pooling: sum or mean"
        return ListColumn(
            name, hash_size=size, separator=sep, max_length=max(1, min(longest, 64))
        ), note
    ints = all(map(is_integer, values))
    widths = {len(v) for v in values}
    # Codes, not quantities: leading zeros (a zip), an id's name, or one width of 4+ digits (1005,
    # 14102100).
    zeros = any(len(v) > 1 and v[0] == "0" and v[1].isdigit() for v in values)
    coded = zeros or code_name(name)
    coded = coded or (ints and len(widths) == 1 and min(widths) >= 4)
    if numeric and not coded:
        low = min(float(v) for v in values)
        transform = "log1p" if low >= 0 else "signed-log1p"
        kind = "int" if ints else "float"
        return DenseColumn(
            name, type=kind, transform=transform
        ), f"{'integers' if ints else 'numbers'}, min {low:g}"
    hex_width = len(widths) == 1 and 8 <= min(widths) <= MAX_HEX_DIGITS
    if hex_width and all(HEX.match(v) for v in values) and not ints:
        size, seen = hash_size(values, "hex")
        return CategoricalColumn(
            name, kind="hex", hash_size=size
        ), f"{min(widths)}-character hex; {seen}"
    # Ids written 66740.0 on a day with nulls and 66740 on one without are one id as integers.
    kind = "integer" if integers or zero_fraction else "string"
    size, seen = hash_size(values, kind)
    if zero_fraction:
        shown = next(v for v in written if "." in v)
        seen += (
            '; written with ".0" (as pandas writes an integer column that has nulls): '
            f'kind = "integer" reads {shown} as {shown.split(".")[0]}, the id a file '
            "written without the fraction gives"
        )
    why = "codes (leading zeros, an id's or a C<n> name, or one width)" if numeric else "strings"
    if ints and not zeros and not integers and not zero_fraction:  # as Parquet's integer column
        as_integers, _ = hash_size(values, "integer")
        seen += (
            f'; hashed as written: kind = "integer" with hash_size = {as_integers} gives the ids '
            "that spec infer proposes for a Parquet integer column of them, or for one written "
            'with ".0" (as pandas writes it where it has nulls)'
        )
    return CategoricalColumn(name, kind=kind, hash_size=size), f"{why}; {seen}"


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
