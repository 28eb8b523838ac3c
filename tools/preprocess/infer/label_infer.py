"""The label of a proposed spec (`shardrec spec infer --label`, spec_infer.py and
parquet_infer.py): the rule as given (`click`, or `rating>=4` for a threshold), the column's
values read as 0/1, a threshold over numbers or a mapping of two written values, and the refusals
that say which threshold or column was meant."""

from __future__ import annotations

import csv
import math
import re
import statistics
from collections import Counter
from pathlib import Path

from shardrec.dataloader.spec.feature_spec import LabelColumn
from shardrec.dataloader.spec.toml_text import toml_value
from shardrec.dataloader.util.near import did_you_mean, name_list
from shardrec.tools.preprocess.parse.spec_program import Program
from shardrec.tools.preprocess.text.gz import READ_ERRORS, open_text
from shardrec.tools.preprocess.text.lines import csv_fields

# ASCII digits: preprocessing reads no others as numbers
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$", re.ASCII)
_COMMA_NUMBER = re.compile(r"^[+-]?(\d+(,\d*)?|,\d+)([eE][+-]?\d+)?$", re.ASCII)
POSITIVE_WORDS = {"yes", "y", "true", "t", "click", "clicked", "positive", "pos", "1"}
NEGATIVE_WORDS = {"no", "n", "false", "f", "noclick", "no_click", "negative", "neg", "0"}


def is_number(v: str) -> bool:
    """A value written as a decimal number (an integer, a decimal, an exponent)."""
    return bool(_NUMBER.match(v))


def is_comma_number(v: str) -> bool:
    """A number written with a decimal comma (13,44), as a spreadsheet writes one in many
    locales (with another delimiter, such as `;`)."""
    return bool(_COMMA_NUMBER.match(v))


def parse_label(text: str) -> tuple[str, float | None]:
    """`click` -> ("click", None); `rating>=4` -> ("rating", 4.0). Another comparison (`rating>4`)
    is refused with the >= that means it."""
    name, sep, threshold = text.partition(">=")
    if not sep:
        other = re.fullmatch(r"\s*([^<>=]+?)\s*(=>|>|<=|<|==|=)\s*(-?[\d.]+)\s*", text)
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
    if op == "=>":  # >= written the other way round
        same = f"--label '{name}>={number}'"
    elif op == ">" and value.is_integer():
        same = f"--label '{name}>={int(value) + 1}' (the same for whole numbers)"
    elif op == ">":  # all but a value equal to the number
        same = f"--label '{name}>={number}' (label 1 where {name} >= {number})"
    else:
        # `==` and `<` have no >= that means them (`rating>=4` for `rating<4` flips every label):
        # a mapping does, where it lists every value, as one not listed is a malformed row.
        ones = f'"{number}" as 1' if op in ("==", "=") else f"each value {op} {number} as 1"
        first = f'"{number}"' if op in ("==", "=") else '"VALUE"'
        same = (
            f"a label mapping in the spec for label 1 where {name} {op} {number}: one that lists "
            f"every value of {name}, {ones} and every other as 0 (mapping = {{ {first} = 1, "
            f'"OTHER" = 0, ... }}); a value it does not list makes its row malformed'
        )
    raise ValueError(
        f"--label {text!r}: a threshold is written NAME>=NUMBER (label 1 where the value is >= it); "
        f"use {same}"
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
    median = _median(values)
    return (
        f"{path}: label column {name!r} holds values other than 0 and 1 (e.g. {shown}; they run "
        f"{exact(min(values))} to {exact(max(values))}, median {exact(median)}); give the "
        f"threshold at which a row counts as 1, e.g. --label '{name}>={exact(median)}'"
    )


def _median(values: list[float]) -> float:
    """A threshold taken from a label's values: their median (of whole numbers, the whole number
    at or above it)."""
    median = float(statistics.median(values))
    return float(math.ceil(median)) if all(float(v).is_integer() for v in values) else median


def threshold_inside(path: Path, name: str, values: list[float], threshold: float) -> None:
    """ValueError for a threshold that makes every label of the sample the same: above every value
    (all 0) or at or below every one (all 1), with one from the values (threshold_wanted's)."""
    low, high = min(values), max(values)
    if low < threshold <= high:
        return
    every = "0: it is above" if threshold > high else "1: it is at or below"
    median = _median(values)
    raise ValueError(
        f"{path}: --label '{name}>={exact(threshold)}' makes every label {every} every value read "
        f"({len(values):,} values, {exact(low)} to {exact(high)}, median {exact(median)}); give a "
        f"threshold within them, e.g. --label '{name}>={exact(median)}'"
    )


def no_label_column(
    path: Path, name: str, names: list[str], unnamed: list[list[str]] | None = None
) -> ValueError:
    """The refusal of a --label that names no column: the columns (the first 30), and the one
    meant where a name is close (a typo). unnamed: the values of each field of a file without a
    header, whose columns are known by place: the refusal asks for a field index, a column of 0s
    and 1s as the example."""
    if unnamed is not None:
        clicks = [i for i, values in enumerate(unnamed) if values and set(values) <= {"0", "1"}]
        example = f", e.g. --label {clicks[0]} (0s and 1s)" if clicks else ""
        return ValueError(
            f"{path}: no column {name!r} for the label: the file has no header line, so its "
            f"columns are known by place, c0 to c{len(names) - 1}; give the label's field index "
            f"(0 for the first){example}"
        )
    return ValueError(
        f"{path}: no column {name!r} for the label (columns: {name_list(names)})"
        f"{did_you_mean(name, names)}"
    )


def label_column(name: str, values: list[str], threshold: float | None, path: Path) -> tuple:
    """(the label column, its note) for the label's values: 0/1 as written, a threshold over
    numbers, or a mapping of two written values (the known words for a click, else the rarer
    value as 1: clicks are the rarer outcome of a click log)."""
    seen = Counter(values)
    shown = sorted(seen)[:5]
    numbers = all(map(is_number, seen))
    if threshold is not None:
        if not numbers:
            words = sorted(v for v in seen if not is_number(v))[:5]
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


def spec_label_rule(path: Path, program: Program, rows: int = 10_000) -> str:
    """The key the spec's label column wants where it has neither a mapping nor a threshold (read
    as 0/1) and its values in the file's first `rows` rows are not 0/1: what `spec infer` proposes
    for them, `mapping = { "true" = 1, "false" = 0 }` for two words or `threshold = 4` for numbers
    (their median); "" where neither fits or the file cannot be read."""
    name = program.names[program.label_field]
    try:
        values = _label_values(path, program, rows)
    except (*READ_ERRORS, ValueError):  # pyarrow's errors are ValueErrors and OSErrors
        return ""
    try:
        column, _ = label_column(name, values, None, path)
    except ValueError:  # numbers other than 0/1 want a threshold, which infer asks for
        numbers = values and all(map(is_number, values))
        return f"threshold = {exact(_median([float(v) for v in values]))}" if numbers else ""
    if column.mapping:
        return f"mapping = {toml_value(column.mapping)}"
    return "" if column.threshold is None else f"threshold = {exact(column.threshold)}"


def _label_values(path: Path, program: Program, rows: int) -> list[str]:
    """The label column's values in the file's first `rows` rows, as text (empty and null values,
    and the spec's words for one, left out; a Parquet boolean as 0/1)."""
    fmt, field = program.spec.format, program.label_field
    if fmt.kind == "parquet":
        import pyarrow.parquet as pq

        columns = [program.names[field]]
        batch = next(pq.ParquetFile(path).iter_batches(batch_size=rows, columns=columns), None)
        read = batch.column(0).to_pylist() if batch is not None else []
        return [str(int(v) if isinstance(v, bool) else v) for v in read if v is not None]
    with open_text(path) as f:
        lines = [f.readline() for _ in range(rows + fmt.header)][fmt.header :]
    text = b"".join(lines).decode("utf-8", "replace")
    quoting = csv.QUOTE_MINIMAL if fmt.quoting else csv.QUOTE_NONE
    rows = csv_fields(text, fmt.delimiter, quoting)
    return [r[field] for r in rows if field < len(r) and r[field] and r[field] not in fmt.missing]
