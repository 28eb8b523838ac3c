"""A feature spec resolved against a file's fields (Program): what the spec parser
(spec_kernel) does with each field index of a row.

`resolve_program` finds each spec column's field: by its `position`, else by name in the file's
header, else by its place in the spec; every field must belong to exactly one column (an unwanted
one is `role = "ignore"`), so that a misspelt name or a shifted file is one clear line, never a
silently wrong column. `criteo_schema` says when a resolved spec is Criteo's shape (label, integers,
hex categoricals, unquoted): such text goes through Criteo's own kernels (criteo_text.py), which are
faster and give the bytes they always gave. Any other spec goes through spec_kernel.
"""

from __future__ import annotations

import csv
import difflib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from shardrec.dataloader.spec.feature_spec import (
    CategoricalColumn,
    DenseColumn,
    FeatureSpec,
    LabelColumn,
    ListColumn,
    SequenceColumn,
    SpecError,
)
from shardrec.tools.preprocess.ids.id_maps import hash_bytes
from shardrec.tools.preprocess.parse import spec_kernel as k
from shardrec.tools.preprocess.parse.criteo_text import Schema
from shardrec.tools.preprocess.text.lines import check_text, csv_fields

_ROLE = {
    LabelColumn: k.LABEL,
    DenseColumn: k.DENSE,
    CategoricalColumn: k.CATEGORICAL,
    ListColumn: k.LIST,
    SequenceColumn: k.LIST,
}
_KIND = {"hex": k.HEX, "integer": k.INTEGER, "string": k.STRING, "int": k.INT, "float": k.FLOAT}


@dataclass(frozen=True, eq=False)
class Program:
    """What the kernel does with each field index of a row (arrays of one entry per field)."""

    spec: FeatureSpec
    names: tuple[str, ...]
    """Column name of each field (messages)."""
    role: np.ndarray
    slot: np.ndarray
    """Index of the field's column among the dense, one-hot or list columns."""
    kind: np.ndarray
    seps: np.ndarray
    max_lengths: np.ndarray
    label_field: int
    min_fields: int
    flags: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    """List fields: spec_kernel.KEEP_LAST (a sequence) and RAW (integers kept as written)."""
    primary: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    """A side sequence's primary field (-1 for every other field)."""
    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    """Label mapping: hashes of the written values (ids.hash_bytes), and their labels beside
    them."""
    values: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    words: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    """The words for a missing value ([format] missing) back to back, word t at
    words[starts[t] : starts[t + 1]] (spec_values.is_missing)."""
    starts: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))

    @property
    def num_fields(self) -> int:
        return len(self.names)

    @property
    def one_hot(self) -> list[CategoricalColumn]:
        return [c for c in self.spec.sparse if not isinstance(c, ListColumn)]

    @property
    def features(self) -> list[tuple[str, bool, int]]:
        """(name, is a list, slot among its kind) of every sparse feature, in spec (manifest)
        order."""
        out, counts = [], [0, 0]
        for c in self.spec.sparse:
            is_list = isinstance(c, ListColumn)
            out.append((c.name, is_list, counts[is_list]))
            counts[is_list] += 1
        return out


def read_header(path: Path, spec: FeatureSpec) -> list[str]:
    """The column names of a file's first line (quotes read as the spec's format reads them)."""
    from shardrec.tools.preprocess.text.gz import open_text

    with open_text(path) as f:
        line = f.readline()
    check_text(path, line, 1)
    text = line.decode("utf-8", "replace").lstrip("\ufeff").rstrip("\r\n")
    quoting = csv.QUOTE_MINIMAL if spec.format.quoting else csv.QUOTE_NONE
    return next(iter(csv_fields(text, spec.format.delimiter, quoting)), [])


def _positions(
    spec: FeatureSpec, header: list[str] | None, where: str, spec_name: str, editable: bool
) -> list[int]:
    """The field index of each spec column."""
    out = []
    placed = {c.position for c in spec.columns if c.position is not None}
    for i, c in enumerate(spec.columns):
        if c.position is not None:
            out.append(c.position)
        elif header is None:
            out.append(i)
        elif c.name in header:
            named = [f for f, h in enumerate(header) if h == c.name and f not in placed]
            if len(named) > 1:  # which one it is, only the user knows
                fix = (
                    f"give {c.name!r} in {spec_name} the position of the field it reads, and "
                    'each other one a [[columns]] of its own with its position (role = "ignore" '
                    "to skip it), as `spec infer` does"
                    if editable
                    else "rename all but one in the file's header"
                )
                raise SpecError(
                    f"{where}: the header names {c.name!r} {len(named)} times (fields "
                    f"{', '.join(map(str, named))}; 0 is the first): {fix}"
                )
            out.append(named[0] if named else header.index(c.name))
        elif (
            len(header) == 1 and len(spec.columns) > 1
        ):  # another format: a TSV (Criteo's rows) read as CSV, ...
            kind = f"{spec.format.kind.upper()} ({spec.format.delimiter!r} between fields)"
            names = ", ".join(col.name for col in spec.columns[:4])
            raise SpecError(
                f"{where}: its first line has no {spec.format.delimiter!r}: {spec_name} reads {kind} with a header "
                f"({names}, ...); this file is in another format"
            )
        else:
            near = difflib.get_close_matches(c.name, header, n=1)
            hint = f"; did you mean {near[0]}?" if near else f" (it has {', '.join(header[:12])})"
            raise SpecError(
                f"{where}: the header has no column {c.name!r} that {spec_name} names{hint}"
            )
    return out


def resolve_program(
    spec: FeatureSpec,
    header: list[str] | None,
    where: str,
    spec_name: str = "the spec",
    editable: bool = True,
) -> Program:
    """Each field's role for the kernel. header: the file's column names (when the format has one).

    where: the data file, first in every message; spec_name: the spec file, named in them too;
    editable: the user can add a column to the spec (not to a model's).
    """
    fields = _positions(spec, header, where, spec_name, editable)
    nf = max(max(fields) + 1, len(header or []))
    owner: dict[int, str] = {}
    for c, f in zip(spec.columns, fields):
        if f in owner:
            raise SpecError(
                f"{where}: field {f} is both {owner[f]!r} and {c.name!r} in {spec_name}"
            )
        owner[f] = c.name
    lost = [f for f in range(nf) if f not in owner]
    if lost:
        what = (
            repr(header[lost[0]])
            if header and lost[0] < len(header)
            else f"field {lost[0]} (0 is the first)"
        )
        if editable:
            raise SpecError(
                f'{where}: column {what} is in no [[columns]] of {spec_name}; add it with role = "ignore" to skip it'
            )
        width = len(spec.columns)
        cut = ""
        if not spec.format.quoting and min(lost) >= width:
            d = "" if spec.format.delimiter == "\t" else f"-d'{spec.format.delimiter}' "
            cut = f"; if the extra ones are the last: `cut {d}-f1-{width} {where} > rows.txt`"
        raise SpecError(
            f"{where}: column {what} is in none of the {width} columns {spec_name} reads, as its "
            f"training data had{cut}"
        )
    role, slot, kind = np.zeros(nf, np.int8), np.zeros(nf, np.int32), np.zeros(nf, np.int8)
    seps, max_lengths = np.full(nf, 10, np.uint8), np.zeros(nf, np.int32)
    counts = {k.DENSE: 0, k.CATEGORICAL: 0, k.LIST: 0}
    flags, primary = np.zeros(nf, np.int8), np.full(nf, -1, np.int32)
    field_of = {c.name: f for c, f in zip(spec.columns, fields)}
    for c, f in zip(spec.columns, fields):
        role[f] = _ROLE.get(type(c), k.IGNORE)
        if isinstance(c, SequenceColumn):
            flags[f] = k.KEEP_LAST | (k.RAW if c.raw else 0)
            if c.side_of:
                primary[f] = field_of[c.side_of]
        if role[f] in counts:
            slot[f], counts[role[f]] = counts[role[f]], counts[role[f]] + 1
        if isinstance(c, (DenseColumn, CategoricalColumn)):
            kind[f] = _KIND[c.type if isinstance(c, DenseColumn) else c.kind]
        if isinstance(c, ListColumn):
            seps[f], max_lengths[f] = ord(c.separator), c.max_length
    for f in fields:  # a side keeps as many values as its primary
        if primary[f] >= 0:
            max_lengths[f] = max_lengths[primary[f]]
    label = spec.label
    keys = np.array([hash_bytes(v.encode()) for v in label.mapping], np.uint64)
    values = np.array(list(label.mapping.values()), np.uint8)
    names = tuple(owner[f] for f in range(nf))
    min_fields = spec.format.min_fields or nf
    missing = [w.encode() for w in spec.format.missing]
    words = np.frombuffer(b"".join(missing), np.uint8).copy()
    starts = np.cumsum([0, *map(len, missing)], dtype=np.int64)
    return Program(spec, names, role, slot, kind, seps, max_lengths, fields[spec.columns.index(label)], min_fields,
                   flags, primary, keys, values, words, starts)  # fmt: skip


def criteo_schema(program: Program) -> tuple[Schema, str] | None:
    """(Schema, dense transform) when the resolved spec is Criteo's shape, read by Criteo's kernels:
    unquoted, no words for a missing value; label first (0/1 as written); then integers, one
    transform for all; then hex categoricals."""
    spec, fmt = program.spec, program.spec.format
    dense, sparse = spec.dense, spec.sparse
    shape = [spec.label, *dense, *sparse]
    order = [program.names.index(c.name) for c in shape]
    if (
        fmt.quoting
        or fmt.missing
        or order != list(range(program.num_fields))
        or spec.label.threshold is not None
        or spec.label.mapping
        or any(d.type != "int" or d.transform != dense[0].transform for d in dense)
        or any(isinstance(c, ListColumn) or c.kind != "hex" for c in sparse)
    ):
        return None
    try:
        schema = Schema(len(dense), len(sparse), fmt.delimiter, fmt.header, program.min_fields)
    except ValueError:  # a delimiter Criteo's parser cannot take (a digit, a letter of hex)
        return None
    return schema, dense[0].transform if dense else "log1p"
