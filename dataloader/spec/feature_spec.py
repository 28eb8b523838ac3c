"""The feature spec: what each column of a click log is, and how it becomes model inputs.

A spec is the text's format (text_format.py: TSV or CSV, delimiter, header, RFC 4180 quoting) and
one typed column per field of a row, by role: the label, dense values, categoricals (one id per
row), lists (a jagged run of ids per row, pooled by sum or mean) and ignored columns. `shardrec
preprocess --spec FILE` reads one from TOML (spec_file.py; the README's "feature spec" section is
the reference); without it, the built-in Criteo spec describes today's rows (label, integers, hex
categoricals). The manifest records the spec a dataset was made with, so a model built from the
dataset (its tables, their pooling) and raw rows scored later are read the same way.

This module holds the values and their rules only; reading and writing files is spec_file.py.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields

from shardrec.dataloader.spec.text_format import TextFormat, one_byte

DENSE_TYPES = ("int", "float")
DENSE_TRANSFORMS = ("log1p", "signed-log1p", "shift-log1p", "none")
CATEGORICAL_KINDS = ("hex", "integer", "string")
POOLINGS = ("sum", "mean")
ROLES = ("label", "dense", "categorical", "list", "sequence", "ignore")
DEFAULT_MAX_LENGTH = 32
MAX_HASH_SIZE = 2**63 - 1
"""The most rows a hashed table can have: preprocess holds table sizes as int64 (and ids as
uint64); 2**63 itself marks a sequence's integers kept as written."""
SEQUENCE_VALUES = ("ids", "timestamps", "integers")
"""What a sequence's values are: ids hashed into a table, or integers kept as written (seconds,
action codes) that no table holds."""


class SpecError(ValueError):
    """A spec that cannot describe a row; the message names the spec file and key."""


@dataclass(frozen=True)
class _Column:
    """What every column has: a name (its header name where the text has one) and a field."""

    name: str
    position: int | None = None
    """Field index, 0 for the first (default: found by name in the header, else the column's place
    in the spec)."""


@dataclass(frozen=True)
class LabelColumn(_Column):
    """The click: 0 or 1 as written, or derived by a threshold or a mapping of the written value."""

    threshold: float | None = None
    """label = 1 where the value (a number) is >= threshold, e.g. 4 for a 1-5 rating."""
    mapping: dict[str, int] = field(default_factory=dict)
    """Written value -> 0 or 1, e.g. {yes = 1, no = 0}; a value not listed is a malformed row."""
    role = "label"

    def __post_init__(self) -> None:
        if self.threshold is not None and self.mapping:
            raise ValueError("give threshold or mapping, not both")
        bad = {k: v for k, v in self.mapping.items() if v not in (0, 1) or isinstance(v, bool)}
        if bad or any(k == "" for k in self.mapping):
            raise ValueError(f"mapping {self.mapping} must map non-empty values to 0 or 1")


@dataclass(frozen=True)
class DenseColumn(_Column):
    """A number fed to the dense layers after a transform; an empty field is 0."""

    type: str = "int"
    """int (an optional '-' and up to 19 digits, within +-(2^63 - 1), `260.0` accepted) or float (decimal, exponent
    allowed)."""
    transform: str = "log1p"
    """log1p (negatives clamped to 0), signed-log1p, shift-log1p (log(4 + max(x, -3))) or none."""
    role = "dense"

    def __post_init__(self) -> None:
        if self.type not in DENSE_TYPES:
            raise ValueError(f"type {self.type!r} is not one of {', '.join(DENSE_TYPES)}")
        if self.transform not in DENSE_TRANSFORMS:
            raise ValueError(
                f"transform {self.transform!r} is not one of {', '.join(DENSE_TRANSFORMS)}"
            )


@dataclass(frozen=True)
class CategoricalColumn(_Column):
    """One id per row: the value hashed into the table (or looked up in a vocabulary); empty is id
    0."""

    kind: str = "string"
    """hex (up to 16 hex digits), integer (decimal, '-' allowed) or string (any bytes, hashed as
    written)."""
    hash_size: int | None = None
    """Table rows in hashing mode (default: preprocess --max-ids); id 0 is the empty value."""
    table: str = ""
    """Another column whose table this one reads (its hash_size), e.g. a candidate item on its
    history sequence's table; empty: a table of its own."""
    role = "categorical"

    def __post_init__(self) -> None:
        if self.kind not in CATEGORICAL_KINDS:
            raise ValueError(f"kind {self.kind!r} is not one of {', '.join(CATEGORICAL_KINDS)}")
        if self.hash_size is not None and self.hash_size < 2:
            raise ValueError(
                f"hash_size {self.hash_size} must be at least 2 (id 0 is the empty value)"
            )
        if self.hash_size is not None and self.hash_size > MAX_HASH_SIZE:
            raise ValueError(
                f"hash_size {self.hash_size} is over {MAX_HASH_SIZE} (2^63 - 1), the most table "
                "rows 64-bit ids can number: give a smaller one"
            )


@dataclass(frozen=True)
class ListColumn(CategoricalColumn):
    """Several ids per row (`Comedy|Drama`), stored jagged and pooled into one embedding."""

    separator: str = "|"
    """Between the values of one field, one byte; empty values are skipped."""
    max_length: int = DEFAULT_MAX_LENGTH
    """Values kept per row (the first ones); the rest are dropped."""
    pooling: str = "sum"
    """How the table pools a row's embeddings: sum or mean."""
    role = "list"

    def __post_init__(self) -> None:
        super().__post_init__()
        one_byte(self.separator, "separator")
        if self.max_length < 1:
            raise ValueError(f"max_length {self.max_length} must be at least 1")
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling {self.pooling!r} is not one of {', '.join(POOLINGS)}")


@dataclass(frozen=True)
class SequenceColumn(ListColumn):
    """An ordered run of values per row, most recent last (a user's history): stored like a list,
    but `max_length` keeps the LAST values, and a sequence model (model.arch = "hstu") reads it in
    order; other models pool it. A side sequence (`side_of`) goes with a primary one: a value
    at each of its positions (its events' times, actions, other ids)."""

    pooling: str = "mean"
    """How a pooled model (DLRM, DCNv2) pools it: sum or mean."""
    side_of: str = ""
    """The primary sequence this one goes with, position by position; empty: a primary."""
    values: str = "ids"
    """ids (hashed into a table as a list's), timestamps (integer seconds) or integers (kept as
    written, >= 0: action codes); the last two need kind = "integer" and have no table."""
    role = "sequence"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.values not in SEQUENCE_VALUES:
            raise ValueError(f"values {self.values!r} is not one of {', '.join(SEQUENCE_VALUES)}")
        if self.values != "ids" and self.kind != "integer":
            raise ValueError(f'values = "{self.values}" needs kind = "integer"')

    @property
    def raw(self) -> bool:
        """Its values are kept as written, not hashed into a table."""
        return self.values != "ids"


@dataclass(frozen=True)
class IgnoredColumn(_Column):
    """A field that is read past and never used (a row id, a free-text note)."""

    role = "ignore"


Column = LabelColumn | DenseColumn | CategoricalColumn | ListColumn | SequenceColumn | IgnoredColumn
COLUMN_TYPES: dict[str, type] = {
    "label": LabelColumn,
    "dense": DenseColumn,
    "categorical": CategoricalColumn,
    "list": ListColumn,
    "sequence": SequenceColumn,
    "ignore": IgnoredColumn,
}


@dataclass(frozen=True)
class FeatureSpec:
    """The format and the columns of a click log; exactly one label."""

    format: TextFormat
    columns: tuple[Column, ...]

    def __post_init__(self) -> None:
        labels = [c.name for c in self.columns if c.role == "label"]
        if len(labels) != 1:
            raise ValueError(
                f"a spec needs exactly one label column, found {len(labels)} ({', '.join(labels)})"
            )
        names = [c.name for c in self.columns]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(
                f"column names must be unique: {', '.join(twice)} appear more than once"
            )
        if "label" in names and self.label.name != "label":
            raise ValueError(
                "'label' names the label of every dataset: give another column another name"
            )
        for c in self.sparse:
            if not _file_name(c.name):
                raise ValueError(
                    f"column {c.name!r} names a feature's file: it must be a plain file name, not label or dense, "
                    "not starting with '.' nor ending in .offsets"
                )
        _check_sequences(self.sparse)
        taken = [w for w in self.format.missing if w in self.label.mapping]
        if taken:
            raise ValueError(
                f"missing word {taken[0]!r} is a value of {self.label.name!r}'s mapping: a row "
                "would have no label; take it out of one of them"
            )
        if self.format.min_fields is not None and self.format.min_fields > len(self.columns):
            raise ValueError(
                f"min_fields {self.format.min_fields} is more than the spec's {len(self.columns)} columns"
            )

    @property
    def label(self) -> LabelColumn:
        return next(c for c in self.columns if isinstance(c, LabelColumn))

    @property
    def dense(self) -> list[DenseColumn]:
        return [c for c in self.columns if isinstance(c, DenseColumn)]

    @property
    def sparse(self) -> list[CategoricalColumn]:
        """Categorical and list columns, in spec order: the dataset's sparse features."""
        return [c for c in self.columns if isinstance(c, CategoricalColumn)]

    @property
    def lists(self) -> list[ListColumn]:
        return [c for c in self.columns if isinstance(c, ListColumn)]

    def to_dict(self) -> dict:
        """Plain data (what the manifest records and spec_file writes as TOML); defaults left
        out."""
        return {
            "format": _changed(self.format),
            "columns": [{"role": c.role, **_changed(c)} for c in self.columns],
        }

    def sha256(self) -> str:
        """Identifies the spec: its plain data, canonical JSON."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


def _check_sequences(sparse: list[CategoricalColumn]) -> None:
    """Sides name a primary sequence; `table` names another column of ids, of the same rows."""
    by_name = {c.name: c for c in sparse}
    for c in sparse:
        if isinstance(c, SequenceColumn) and c.side_of:
            primary = by_name.get(c.side_of)
            if not isinstance(primary, SequenceColumn) or primary.side_of:
                raise ValueError(
                    f"column {c.name!r}: side_of = {c.side_of!r} names no primary sequence column"
                )
        if c.table:
            other = by_name.get(c.table)
            if other is None or other is c or (isinstance(other, SequenceColumn) and other.raw):
                raise ValueError(
                    f"column {c.name!r}: table = {c.table!r} names no other column of ids"
                )
            if other.hash_size != c.hash_size:
                raise ValueError(
                    f"column {c.name!r} reads the table of {c.table!r}: give both one hash_size "
                    f"({c.hash_size} and {other.hash_size})"
                )


def _file_name(name: str) -> bool:
    """A sparse feature's name is its column files' name: label.npy and dense.npy are taken."""
    return (
        bool(name)
        and not any(c in name for c in "/\\\0")
        and not name.startswith(".")
        and name not in ("label", "dense")
        and not name.endswith(".offsets")
    )


def _changed(value) -> dict:
    """The fields of a dataclass value that differ from their defaults (name always); a tuple as
    the list that JSON and TOML give back."""
    out = {}
    data = asdict(value)
    for f in fields(value):
        default = f.default_factory() if callable(f.default_factory) else f.default
        if f.name == "name" or data[f.name] != default:
            v = data[f.name]
            out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def criteo_spec(
    num_dense: int = 13,
    num_sparse: int = 26,
    delimiter: str = "\t",
    header: bool = False,
    min_fields: int | None = None,
    dense_transform: str = "log1p",
) -> FeatureSpec:
    """The built-in spec: label, integers I1.., hex categoricals C1.. (Criteo's rows), unquoted.

    min_fields: None means all fields but 3, as Criteo's writer strips up to 3 trailing empty ones.
    """
    nf = 1 + num_dense + num_sparse
    return FeatureSpec(
        TextFormat(
            "csv" if delimiter == "," else "tsv",
            delimiter,
            header,
            False,
            max(1, nf - 3) if min_fields is None else min_fields,
        ),
        (
            LabelColumn("label"),
            *(DenseColumn(f"I{i}", transform=dense_transform) for i in range(1, num_dense + 1)),
            *(CategoricalColumn(f"C{i}", kind="hex") for i in range(1, num_sparse + 1)),
        ),
    )
