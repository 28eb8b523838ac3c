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
  fixed-width hex with letters (Criteo's, Avazu's ids) a hex categorical; anything else a string
  categorical;
- hash sizes: twice an estimate of each categorical's distinct values (Chao1: the sample's
  distinct values plus the unseen ones its singletons suggest), within [16, 10,000,000]; where the
  sample saw nearly all of a column's values, raised to the smallest size (up to 8 times it) that
  gives each its own id (spec_hash_fit.py); where none does, the comment says how many share one.

A Parquet file's spec is parquet_infer.py's, from its schema and these column rules.

Every choice is written beside its column as a comment, for the user to check and edit.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
import statistics
from collections import Counter
from pathlib import Path

from shardrec.dataloader.spec.feature_spec import (
    CategoricalColumn,
    Column,
    DenseColumn,
    FeatureSpec,
    IgnoredColumn,
    LabelColumn,
    ListColumn,
    TextFormat,
)
from shardrec.dataloader.util.near import did_you_mean, name_list
from shardrec.tools.preprocess.infer.spec_hash_fit import fit_hash_size
from shardrec.tools.preprocess.text.gz import open_text
from shardrec.tools.preprocess.text.lines import check_text, csv_fields

DELIMITERS = ("\t", ",", ";", "|")
LIST_SEPARATORS = ("|", ";", ",")
MAX_HASH_SIZE = 10_000_000
_INT = re.compile(r"^-?\d{1,18}$")
_FLOAT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
HEX = re.compile(r"^[0-9a-fA-F]+$")
_COMMA_FLOAT = re.compile(r"^[+-]?(\d+(,\d*)?|,\d+)([eE][+-]?\d+)?$")
# Words for the two values of a label column: which one is the click.
POSITIVE_WORDS = {"yes", "y", "true", "t", "click", "clicked", "positive", "pos", "1"}
NEGATIVE_WORDS = {"no", "n", "false", "f", "noclick", "no_click", "negative", "neg", "0"}
_ID_NAME = re.compile(r"(^|_)id$|Id$|ID$")
# Anonymised categoricals are named C1, C2, ... by convention (Criteo's C1-C26, Avazu's C1 and
# C14-C21).
_CATEGORY_NAME = re.compile(r"^C\d+$")
_TIME_NAME = re.compile(r"time|date|(^|_)ts$", re.IGNORECASE)
# Unix seconds from 2000-01-01 to 2100-01-01: a code of 9-10 digits in this range is a time.
_UNIX_SECONDS = (946_684_800, 4_102_444_800)


def parse_label(text: str) -> tuple[str, float | None]:
    """`click` -> ("click", None); `rating>=4` -> ("rating", 4.0). Another comparison (`rating>4`)
    is refused with the >= that means it."""
    name, sep, threshold = text.partition(">=")
    if not sep:
        other = re.fullmatch(r"\s*(.+?)\s*(>|<=|<|==|=)\s*(-?[\d.]+)\s*", text)
        if other:
            _comparison(text, *other.groups())
        return text.strip(), None
    try:
        return name.strip(), float(threshold)
    except ValueError:
        raise ValueError(
            f"--label {text!r}: the threshold after >= must be a number, e.g. rating>=4"
        ) from None


def _comparison(text: str, name: str, op: str, number: str) -> None:
    """ValueError for a label rule other than >=, with the >= rule that means it."""
    value = float(number)
    if op == ">" and value.is_integer():
        same = f"--label '{name}>={int(value) + 1}' (the same for whole numbers)"
    elif op in ("==", "="):
        same = 'a spec\'s label mapping (role = "label", mapping = { ... }) for one value'
    else:
        same = f"--label '{name}>={number}' (label 1 where {name} >= {number})"
    raise ValueError(
        f"--label {text!r}: a threshold is written NAME>=NUMBER (label 1 where the value is >= it); "
        f"use {same}"
    )


def sample_lines(path: Path, rows: int) -> tuple[list[str], bool]:
    """The first `rows` + 1 non-empty lines of the file (the header's too), and whether that was
    the whole file."""
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
    return [line for line in lines if line], whole


def _split(lines: list[str], delimiter: str) -> list[list[str]]:
    return csv_fields("\n".join(lines), delimiter)


def _delimiter(lines: list[str]) -> str:
    """The delimiter that cuts the first lines into the most fields, nearly the same number each."""
    best, score = "\t", 0.0
    for d in DELIMITERS:
        counts = Counter(len(r) for r in _split(lines[:200], d))
        common, seen = counts.most_common(1)[0]
        near = sum(n for c, n in counts.items() if abs(c - common) <= 3)
        if common > 1 and near >= 0.9 * sum(counts.values()) and common * near > score:
            best, score = d, common * near
    return best


def _is_number(v: str) -> bool:
    return bool(_FLOAT.match(v))


def _has_header(rows: list[list[str]]) -> bool:
    first, rest = rows[0], rows[1:]
    for i, value in enumerate(first):
        below = [r[i] for r in rest if i < len(r) and r[i]]
        if (
            value
            and below
            and not _is_number(value)
            and sum(map(_is_number, below)) >= 0.9 * len(below)
        ):
            return True
    if any(_is_number(v) for v in first):
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
    for sep in LIST_SEPARATORS:
        if sep != delimiter and sum(sep in v for v in values) >= 0.05 * len(values):
            return sep
    return None


def _unix_times(name: str, values: list[str]) -> str | None:
    """`2000-04-25 .. 2000-05-03` when every value is a Unix time in seconds or milliseconds and the
    column is named like a time or nearly every value is new; else None."""
    if _ID_NAME.search(name) or not all(_INT.match(v) for v in values):
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


def propose_column(
    name: str, values: list[str], rows: int, delimiter: str, integers: bool = False
) -> tuple[Column, str]:
    """The proposed column for the non-empty values of one column, and why. integers: the values
    are a Parquet integer column's, a categorical of them reads them as integers."""
    if not values:
        return IgnoredColumn(name), f"empty in all {rows:,} rows"
    dates = _unix_times(name, values)
    if dates is not None:
        unit = ", in milliseconds" if len(values[0]) > 11 else ""
        return IgnoredColumn(
            name
        ), f"Unix times{unit} ({dates}): later data holds only new values; derive an hour or a day"
    distinct = len(set(values))
    if distinct == len(values) >= 50 and min(map(len, values)) >= 10:
        return IgnoredColumn(name), "a different value in every row: a row id, not a feature"
    numeric = all(map(_is_number, values))
    sep = None if numeric else _list_separator(values, delimiter)
    if sep is not None:
        items = [i for v in values for i in v.split(sep) if i]
        longest = max(len([i for i in v.split(sep) if i]) for v in values)
        size, seen = hash_size(items)
        note = f"values cut by {sep!r}, up to {longest} in a row; {seen}; pooling: sum or mean"
        return ListColumn(
            name, hash_size=size, separator=sep, max_length=max(1, min(longest, 64))
        ), note
    ints = all(_INT.match(v) for v in values)
    widths = {len(v) for v in values}
    # Codes, not quantities: leading zeros (a zip), an id's name, or one width of 4+ digits (1005,
    # 14102100).
    coded = any(len(v) > 1 and v[0] == "0" and v[1].isdigit() for v in values) or bool(
        _ID_NAME.search(name) or _CATEGORY_NAME.match(name)
    )
    coded = coded or (ints and len(widths) == 1 and min(widths) >= 4)
    if numeric and not coded:
        low = min(float(v) for v in values)
        transform = "log1p" if low >= 0 else "signed-log1p"
        kind = "int" if ints else "float"
        return DenseColumn(
            name, type=kind, transform=transform
        ), f"{'integers' if ints else 'numbers'}, min {low:g}"
    if len(widths) == 1 and min(widths) >= 8 and all(HEX.match(v) for v in values) and not ints:
        size, seen = hash_size(values, "hex")
        return CategoricalColumn(
            name, kind="hex", hash_size=size
        ), f"{min(widths)}-character hex; {seen}"
    kind = "integer" if integers else "string"
    size, seen = hash_size(values, kind)
    why = "codes (leading zeros, an id's or a C<n> name, or one width)" if numeric else "strings"
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


def exact(x: float) -> str:
    """A number written so that it reads back the same: 14102100, where %g's 1.41021e+07 (a
    threshold pasted from it made every label 1)."""
    x = float(x)
    return str(int(x)) if x.is_integer() and abs(x) < 2**63 else repr(x)


def threshold_wanted(path: Path, name: str, values: list[float], shown: list[str]) -> str:
    """The refusal of a numeric label that is not 0/1, with a threshold taken from its values (the
    median: about half the rows would be 1; a click log's positives are usually fewer; of whole
    numbers, the whole number at or above it)."""
    median = float(statistics.median(values))
    if all(float(v).is_integer() for v in values):
        median = float(math.ceil(median))
    return (
        f"{path}: label column {name!r} holds values other than 0 and 1 (e.g. {shown}; they run "
        f"{exact(min(values))} to {exact(max(values))}, median {exact(median)}); give the "
        f"threshold at which a row counts as 1, e.g. --label '{name}>={exact(median)}'"
    )


def threshold_inside(path: Path, name: str, values: list[float], threshold: float) -> None:
    """ValueError for a threshold that makes every label of the sample the same: above every value
    (all 0) or at or below every one (all 1), with one from the values (threshold_wanted's)."""
    low, high = min(values), max(values)
    if low < threshold <= high:
        return
    every = "0: it is above" if threshold > high else "1: it is at or below"
    median = float(statistics.median(values))
    if all(float(v).is_integer() for v in values):
        median = float(math.ceil(median))
    raise ValueError(
        f"{path}: --label '{name}>={exact(threshold)}' makes every label {every} every value read "
        f"({len(values):,} values, {exact(low)} to {exact(high)}, median {exact(median)}); give a "
        f"threshold within them, e.g. --label '{name}>={exact(median)}'"
    )


def no_label_column(path: Path, name: str, names: list[str]) -> ValueError:
    """The refusal of a --label that names no column: the columns (the first 30), and the one
    meant where a name is close (a typo)."""
    return ValueError(
        f"{path}: no column {name!r} for the label (columns: {name_list(names)})"
        f"{did_you_mean(name, names)}"
    )


def _label_column(name: str, values: list[str], threshold: float | None, path: Path) -> tuple:
    """(the label column, its note) for the label's values: 0/1 as written, a threshold over
    numbers, or a mapping of two written values (the known words for a click, else the rarer
    value as 1: clicks are the rarer outcome of a click log)."""
    seen = Counter(values)
    shown = sorted(seen)[:5]
    numbers = all(map(_is_number, seen))
    if threshold is not None:
        if not numbers:
            words = sorted(v for v in seen if not _is_number(v))[:5]
            raise ValueError(
                f"{path}: label column {name!r} holds values that are not numbers (e.g. {words}); "
                "a threshold compares numbers: give the label column without one"
            )
        if values:
            threshold_inside(path, name, [float(v) for v in values], threshold)
        return LabelColumn(
            name, threshold=threshold
        ), f"the label: 1 where {name} >= {exact(threshold)}"
    if set(seen) <= {"0", "1"}:
        return LabelColumn(name), "the label"
    if numbers and {float(v) for v in seen} <= {0.0, 1.0}:  # 0/1 written as 0.0/1.0
        return LabelColumn(name, threshold=1.0), f"the label (written {', '.join(shown)})"
    if numbers:
        raise ValueError(threshold_wanted(path, name, [float(v) for v in values], shown))
    if len(seen) != 2:
        raise ValueError(
            f"{path}: label column {name!r} holds {len(seen):,} distinct values (e.g. {shown}), "
            "not two: give the column that says whether a row is a click"
        )
    a, b = sorted(seen, key=lambda v: (seen[v], v))  # a: the rarer
    known = [v for v in (a, b) if v.strip().lower() in POSITIVE_WORDS]
    negative = [v for v in (a, b) if v.strip().lower() in NEGATIVE_WORDS]
    if len(known) == 1 and len(negative) == 1 and known != negative:
        one, zero, why = known[0], negative[0], "by their words"
    else:
        one, zero, why = a, b, f"the rarer value as 1 ({seen[a]:,} of {len(values):,}): check it"
    return (
        LabelColumn(name, mapping={one: 1, zero: 0}),
        f"the label: 1 where {name} is {one!r}, 0 where {zero!r} ({why})",
    )


def _decimal_commas(columns: list[list[str]]) -> bool:
    """Numbers written with decimal commas (13,44): some column is all numbers that way, at least
    one with a comma (a semicolon CSV from a spreadsheet in many locales)."""
    for values in columns:
        if values and any("," in v for v in values) and all(_COMMA_FLOAT.match(v) for v in values):
            return True
    return False


def infer_spec(path: Path, label: str, rows: int = 10_000) -> tuple[FeatureSpec, dict[str, str]]:
    """A spec for the file from its first `rows` rows, and a note per column saying why.

    label: the label column's header name or field index (0 for the first), with an optional
    `>=` threshold (`rating>=4`). ValueError names what does not fit.
    """
    lines, _ = sample_lines(path, rows)
    if len(lines) < 2:
        raise ValueError(f"{path}: {len(lines)} line(s): too few to infer a spec from")
    delimiter = _delimiter(lines)
    table = _split(lines, delimiter)
    header = _has_header(table)
    width = max(len(r) for r in table)
    names = [n.strip() for n in table[0]] if header else [f"c{i}" for i in range(width)]
    body = table[1:] if header else table
    label_name, threshold = parse_label(label)
    if label_name not in names and label_name.isdigit() and int(label_name) < len(names):
        label_name = names[int(label_name)]
    if label_name not in names:
        raise no_label_column(path, label_name, names)
    values_of = [[r[i] for r in body if i < len(r) and r[i] != ""] for i in range(len(names))]
    decimal = delimiter != "," and _decimal_commas(values_of)
    columns, notes = [], {}
    for i, name in enumerate(names):
        values = values_of[i]
        if decimal and values and all(_COMMA_FLOAT.match(v) for v in values):
            values = [v.replace(",", ".") for v in values]
        if name == label_name:
            column, notes[name] = _label_column(name, values, threshold, path)
            columns.append(column)
            continue
        column, notes[name] = propose_column(name, values, len(body), delimiter)
        if decimal and isinstance(column, DenseColumn) and column.type == "float":
            notes[name] += " (decimal commas: 13,44 is 13.44)"
        columns.append(_placed(column, i, names))
    counts = [len(r) for r in body]
    fmt = TextFormat(
        "tsv" if delimiter == "\t" else "csv",
        delimiter,
        header,
        delimiter == "," or any('"' in line for line in lines[:200]),
        min(counts) if min(counts) < width else None,
        "," if decimal else None,
    )
    return FeatureSpec(fmt, tuple(columns)), notes
