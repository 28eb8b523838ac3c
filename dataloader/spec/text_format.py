"""How a click log's rows are written (TextFormat: TSV or CSV, delimiter, header, RFC 4180
quoting, decimal point, words for a missing value; or Parquet files), and the rules its values
follow; a feature spec's `[format]` section (feature_spec.FeatureSpec.format).
"""

from __future__ import annotations

from dataclasses import dataclass

FORMAT_KINDS = ("tsv", "csv", "parquet")
PARQUET_MISSING = (
    "missing is for text formats: a Parquet file writes a missing value as a null, which is read "
    "as one already"
)
"""The refusal of `[format] missing` in a Parquet spec (a feature spec's or an event spec's)."""


def one_byte(value: str, what: str, forbidden: str = '\r\n"') -> None:
    """ValueError unless `value` (a delimiter, a list's separator) is one byte, none of
    `forbidden`."""
    if len(value.encode()) != 1 or value in forbidden:
        raise ValueError(
            f"{what} {value!r} must be one byte other than {', '.join(map(repr, forbidden))}"
        )


@dataclass(frozen=True)
class TextFormat:
    """How rows are written: fields, quoting, a header line; or Parquet files (columns by name)."""

    kind: str = "tsv"
    """tsv, csv or parquet; sets the delimiter and quoting defaults (parquet has neither: its
    columns are found by name)."""
    delimiter: str = ""
    """Field separator, one byte (default: a tab for tsv, a comma for csv)."""
    header: bool = False
    """Each file starts with a line of column names (columns are then found by name)."""
    quoting: bool | None = None
    """RFC 4180 double quotes: a field in quotes ("a, b") may hold the delimiter, and "" inside it
    is one quote; not a newline. Default: on for csv, off for tsv."""
    min_fields: int | None = None
    """Fewest fields a row may have, its missing trailing fields empty (default: every column)."""
    decimal: str | None = None
    """The decimal point of float columns and a label threshold's numbers: "," where numbers are
    written 13,44 (then the delimiter is not a comma; default ".")."""
    files: str | None = None
    """Which files of a directory input are read: a glob pattern such as `part-*.csv.gz` (default:
    Criteo's names, day_N, train and dac_sample, bare or with the format's extension)."""
    missing: tuple[str, ...] = ()
    """Words written for a missing value in any column, such as ["NA", "\\N"] (R's, a MySQL
    dump's): read as an empty field is (dense 0, id 0), and skipped as a list's value (default:
    only an empty field is missing)."""

    def __post_init__(self) -> None:
        if self.kind not in FORMAT_KINDS:
            raise ValueError(f"kind {self.kind!r} is not one of {', '.join(FORMAT_KINDS)}")
        object.__setattr__(self, "missing", tuple(self.missing))
        if self.kind == "parquet":
            if self.missing:
                raise ValueError(PARQUET_MISSING)
            given = [k for k, v in (("delimiter", self.delimiter), ("header", self.header),
                     ("quoting", self.quoting), ("min_fields", self.min_fields)) if v]  # fmt: skip
            if given:
                raise ValueError(
                    f"{given[0]} is for text formats: a Parquet file's columns are found by name"
                )
            return
        if not self.delimiter:
            object.__setattr__(self, "delimiter", "\t" if self.kind == "tsv" else ",")
        if self.quoting is None:
            object.__setattr__(self, "quoting", self.kind == "csv")
        one_byte(self.delimiter, "delimiter")
        if self.min_fields is not None and self.min_fields < 1:
            raise ValueError(f"min_fields {self.min_fields} must be at least 1")
        if self.decimal not in (None, ".", ","):
            raise ValueError(f"decimal {self.decimal!r} must be '.' or ','")
        if self.decimal == "," and self.delimiter == ",":
            raise ValueError("decimal ',' needs another delimiter than ',' (such as ';')")
        if self.files is not None and (not self.files or "/" in self.files):
            raise ValueError(f"files {self.files!r} must be a file-name pattern such as '*.csv'")
        check_missing_words(self.missing, self.delimiter)


def check_missing_words(words: tuple[str, ...], delimiter: str) -> None:
    """Each word a whole field can be: not empty (an empty field is missing already), without the
    delimiter, a quote or a line break, and given once."""
    for word in words:
        if not isinstance(word, str) or not word:
            raise ValueError(f"missing {list(words)}: each word must be a non-empty string")
        bad = next((c for c in (delimiter, '"', "\r", "\n") if c in word), None)
        if bad is not None:
            raise ValueError(
                f"missing word {word!r} holds {bad!r}: a word for a missing value is a whole "
                "field, without the delimiter, a quote or a line break"
            )
    twice = sorted({w for w in words if words.count(w) > 1})
    if twice:
        raise ValueError(f"missing gives {', '.join(map(repr, twice))} more than once")
