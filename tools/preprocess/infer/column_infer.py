"""The column rules of a proposed feature spec: each column's role, kind and hash size from the
non-empty values a sample of it holds (spec_infer.py's text columns, parquet_infer.py's Parquet
ones).

- each column's role (the label's is label_infer.py's): a column empty in every row, or with a
  different long value in every row (a row id), is ignored; values cut by `|` or `;` (or `,` in a
  TSV) in many rows make a list; Unix times (seconds or milliseconds since 1970, dated 2000-2100,
  under a time-like name or nearly all distinct) are ignored: a category of times would meet only
  new values in later data; integers make a dense column (log1p, or signed-log1p when negative), but
  for id-like names (`..._id`), the anonymised categoricals' `C<n>` names (Criteo's, Avazu's
  C14-C21) and codes with leading zeros; decimals a float dense column; fixed-width hex with
  letters, 8-16 digits (Criteo's, Avazu's ids), a hex categorical; anything else (an MD5's 32 digits
  too) a string categorical;
- hash sizes: twice an estimate of each categorical's distinct values (Chao1: the sample's
  distinct values plus the unseen ones its singletons suggest), within [16, 10,000,000]; where the
  sample saw nearly all of a column's values, raised to the smallest size (up to 8 times it) that
  gives each its own id (spec_hash_fit.py); where none does, the comment says how many share one.
"""

from __future__ import annotations

import datetime
import math
import re
from collections import Counter

from shardrec.dataloader.spec.feature_spec import (
    CategoricalColumn,
    Column,
    DenseColumn,
    IgnoredColumn,
    ListColumn,
)
from shardrec.tools.preprocess.infer.label_infer import is_number
from shardrec.tools.preprocess.infer.spec_hash_fit import fit_hash_size
from shardrec.tools.preprocess.parse.parse_fields import INT64_MAX

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


def is_integer(v: str) -> bool:
    """A value preprocessing reads as an integer: an optional '-' and up to 19 digits within
    +-INT64_MAX (parse_kernel.decode_int's rule)."""
    return bool(_INT.match(v)) and abs(int(v)) <= INT64_MAX


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
