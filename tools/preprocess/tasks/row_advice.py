"""What to do about a malformed row, by its reason (criteo_text.REASONS): what its field reads and
the edits that would read the value, said alike by every command that stops at one: preprocess's
refusals (more malformed rows than --max-skipped-fraction allows, --strict's first) and predict's
(raw_labels.value_hint, which adds that the model's rows are fixed)."""

from __future__ import annotations

from shardrec.dataloader.spec.feature_spec import (
    CategoricalColumn,
    DenseColumn,
    FeatureSpec,
    LabelColumn,
)
from shardrec.tools.preprocess.parse.parquet_schema import FLOAT_EXACT_BITS

READS = {
    "bad_hex": "hex ids of 1 to 16 digits",
    "bad_integer": "whole numbers",
    "bad_float": "finite numbers",
}
"""What a column reads, by the reason a value of it is malformed."""


def _column(spec: FeatureSpec | None, name: str):
    return next((c for c in spec.columns if c.name == name), None) if spec else None


def _label_reads(column: LabelColumn | None) -> str:
    if column is not None and column.mapping:
        return f"one of its mapping's values ({', '.join(map(repr, column.mapping))})"
    return "numbers" if column is not None and column.threshold is not None else "0 or 1"


def _edits(
    reason: str, field: str, spec: FeatureSpec | None, parquet: bool, float_bits: int = 64
) -> list[str]:
    """The spec keys (or, for Criteo's rows without a spec, the flags) that read such a value;
    float_bits: the width of a Parquet column's floats."""
    column = _column(spec, field)
    if reason == "bad_hex" and spec is not None:
        return [f'give {field} kind = "string" (any value, hashed)']
    if reason == "bad_integer" and isinstance(column, DenseColumn):
        return [f'give {field} type = "float" if its values have fractions']
    if reason == "bad_integer" and isinstance(column, CategoricalColumn) and not parquet:
        if getattr(column, "values", "ids") == "ids":  # a sequence's timestamps stay integers
            return [f'give {field} kind = "string" (any value, hashed)']
    if reason == "bad_integer" and isinstance(column, CategoricalColumn):
        # A Parquet integer column always decodes: the value is a float's.
        exact = FLOAT_EXACT_BITS.get(float_bits, 53)
        return [
            f'write {field} as integers (pandas: .astype("Int64"); a float{float_bits} is an id '
            f"only as a whole number below 2^{exact}, from which floats skip integers)"
        ]
    if reason == "bad_label" and isinstance(column, LabelColumn) and not parquet:  # there: null
        if not column.mapping and column.threshold is None:
            return [f"give {field} a threshold or a mapping of its values"]
    if reason == "too_few_fields":
        key = "[format] min_fields" if spec is not None else "--min-fields"
        return [f"lower {key} to read a shorter row's missing last fields as empty"]
    if reason == "too_many_fields" and spec is not None:
        return ['give each field a [[columns]] table (role = "ignore" to leave one out)']
    if reason == "bad_quote":
        return ["give [format] quoting = false if its quotes are part of the values"]
    return []


def _or(options: list[str]) -> str:
    if len(options) < 3:
        return " or ".join(options)
    return f"{', '.join(options[:-1])}, or {options[-1]}"


def row_advice(
    reason: str,
    field: str,
    spec: FeatureSpec | None,
    parquet: bool,
    skip: str = "",
    float_bits: int = 64,
) -> str:
    """`; what field reads: correct the row, the edits that read its value, or skip` for a row
    malformed by `reason` in `field` (a column's name, or "row"); `spec`: the run's feature spec
    (None: Criteo's rows as the schema flags describe them); `skip`: how the run would skip such
    rows ("" where none would); `float_bits`: the width of the floats of a Parquet column (an id
    column's bound is its type's, FLOAT_EXACT_BITS)."""
    missing = "null" if parquet else "an empty field"
    if reason in READS:
        said = f"{field} reads {READS[reason]}, a missing value as {missing}: "
    elif reason == "bad_label":
        name = "the label" if field == "label" else f"the label column {field}"
        said = f"{name} reads {_label_reads(_column(spec, field))} and is never missing: "
    elif reason == "side_length":
        said = f"{field} needs a value at each position of the sequence it is a side of: "
    else:
        said = ""
    fix = "remove the line" if reason == "empty_row" else "correct the row"
    options = [fix, *_edits(reason, field, spec, parquet, float_bits), *([skip] if skip else [])]
    return f"; {said}{_or(options)}"
