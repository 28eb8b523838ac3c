"""The words a sampled text log writes for a missing value, proposed as `[format] missing`
(`spec infer`).

A word is proposed where it cannot be a value: among numbers (`NA` in a column of ages, as R and
pandas' `to_csv(na_rep="NA")` write one), or a MySQL dump's `\\N` anywhere. The spec's key reads it
as missing in every column, so a column of strings that holds it too (a country's code `NA`) is
named in the line for the user, with the command that empties the number columns' fields alone
instead. A word found only among strings is a value: its column's note says how to make it a
missing one.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from shardrec.dataloader.spec.missing_words import MISSING_WORDS
from shardrec.dataloader.spec.toml_text import toml_value
from shardrec.tools.preprocess.infer.label_infer import is_comma_number, is_number

MYSQL_NULL = "\\N"
"""A MySQL or Hive dump's NULL: never a value, a word for a missing one in any column."""


@dataclass
class MissingWords:
    """What the sample says of words for a missing value: the proposed words, and notes."""

    words: tuple[str, ...] = ()
    """The proposed `[format] missing`, in the order first seen."""
    notes: dict[int, str] = field(default_factory=dict)
    """Field index -> what its column's comment says of them."""
    advice: str = ""
    """The line for the user (printed, and on top of the spec); "" where nothing is proposed."""

    def values(self, values: list[str]) -> list[str]:
        """A column's values without the proposed words: what the spec reads as values."""
        return [v for v in values if v not in self.words] if self.words else values


def _among_numbers(values: list[str], delimiter: str) -> Counter:
    """The words for a missing value in a column whose other values are all numbers (with another
    delimiter than a comma, 13,44 too: R's write.csv2 writes NA among decimal commas), with their
    counts; empty where there are none, or other words too."""
    words = Counter(v for v in values if v in MISSING_WORDS)
    rest = [v for v in values if v not in MISSING_WORDS]
    commas = delimiter != "," and all(map(is_comma_number, rest))
    return words if words and rest and (commas or all(map(is_number, rest))) else Counter()


def _make_missing(proposed: tuple[str, ...], listed: Counter) -> str:
    """The edit that makes a column's `listed` words missing too: the key, or where the spec
    proposes one already, the key with them added (a second `missing` line is no TOML)."""
    if not proposed:
        return f"add missing = {toml_value(list(listed))} to [format]"
    return f"make [format]'s missing = {toml_value([*proposed, *listed])}"


def _counts(words: Counter, rows: int) -> str:
    return " and ".join(f"'{w}' in {n:,}" for w, n in words.items()) + f" of {rows:,} rows"


def find_missing_words(
    names: list[str],
    values_of: list[list[str]],
    label: int,
    rows: int,
    delimiter: str,
    quoting: bool,
) -> MissingWords:
    """The words to propose for columns `names` whose non-empty sampled values are `values_of`
    (the label's, at index `label`, is no evidence), of `rows` rows cut at `delimiter` (outside
    double quotes where `quoting`)."""
    numbers = {i: _among_numbers(v, delimiter) for i, v in enumerate(values_of) if i != label}
    numbers = {i: c for i, c in numbers.items() if c}
    seen = [v for i, vs in enumerate(values_of) for v in vs if v in MISSING_WORDS]
    words = {w for c in numbers.values() for w in c} | ({MYSQL_NULL} & set(seen))
    found = MissingWords(tuple(sorted(words, key=seen.index)))
    others: dict[int, Counter] = {}
    for i, values in enumerate(values_of):
        listed = Counter(v for v in values if v in MISSING_WORDS)
        mine = Counter({w: n for w, n in listed.items() if w in words})
        if i in numbers:
            found.notes[i] = (
                f"numbers but for {_counts(numbers[i], rows)}: [format] missing reads "
                f"{'it' if len(numbers[i]) == 1 else 'them'} as missing"
            )
        elif mine:
            found.notes[i] = f"{_counts(mine, rows)}, read as missing ([format] missing)"
            others[i] = Counter({w: n for w, n in mine.items() if w != MYSQL_NULL})
        elif listed and i != label:
            found.notes[i] = (
                f"{_counts(listed, rows)}: a value here; if it means a missing one, "
                f"{_make_missing(found.words, listed)} (then missing in every column)"
            )
    if words:
        found.advice = _advice(found.words, names, numbers, others, rows, delimiter, quoting)
    return found


def _advice(
    words: tuple[str, ...],
    names: list[str],
    numbers: dict[int, Counter],
    others: dict[int, Counter],
    rows: int,
    delimiter: str,
    quoting: bool,
) -> str:
    """The line saying what `[format] missing` proposes, from which columns; where a column of
    other values holds one of its words (not `\\N`), what it then reads, and the command that
    empties the number columns' fields alone instead."""
    said = f"[format] missing = {toml_value(list(words))} proposed"
    if numbers:
        columns = ", ".join(f"{names[i]} ({_counts(c, rows)})" for i, c in numbers.items())
        said += f" for {columns}, numbers but for words for a missing value"
    if MYSQL_NULL in words:
        said += f"{';' if numbers else ':'} '\\N' is a MySQL or Hive dump's NULL"
    said += f"; {'it is' if len(words) == 1 else 'each is'} read as missing in every column"
    others = {i: c for i, c in others.items() if c}
    if not others or not numbers:
        return said
    held = ", ".join(f"{names[i]} ({_counts(c, rows)})" for i, c in others.items())
    return (
        f"{said}: in {held} too; where it is a value there (as NA is a country's code), take it "
        f"out of missing and empty the number columns' fields alone instead "
        f"({_empty_command(numbers, delimiter, quoting)} FILE > NEW_FILE), then infer again"
    )


def _empty_command(numbers: dict[int, Counter], delimiter: str, quoting: bool) -> str:
    """Perl's substitutions that empty the words of the number columns (by field index) alone, at
    their place in the row, as another column's `NA` may be a value. With quoting, a field in
    double quotes is one field whatever delimiters it holds (`"Paris, France"`), and a quoted word
    (`"NA"`, which the spec reads as missing too) is emptied as well."""
    d = {"\t": "\\t"}.get(delimiter, re.escape(delimiter))
    # A field, then its delimiter. Quoted: a quoted field or one that does not start with a quote,
    # atomic (?>...) so that a failed match cannot retry a quoted field as cut at its delimiter.
    field = f'(?>"(?:[^"\\n]|"")*"|[^{d}"\\n][^{d}\\n]*|)' if quoting else f"[^{d}\\n]*"

    def empty(i: int, words: Counter) -> str:
        """The substitution of the words at field i (after i fields and their delimiters)."""
        written = sorted(words) + ([f'"{w}"' for w in sorted(words)] if quoting else [])
        alternatives = "|".join(map(re.escape, written))
        return f"s{{^((?:{field}{d}){{{i}}})(?:{alternatives})(?![^{d}\\r\\n])}}{{$1}}"

    return f"perl -pe '{'; '.join(empty(i, c) for i, c in numbers.items())}'"
