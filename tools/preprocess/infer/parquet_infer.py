"""A proposed feature spec for a Parquet file (`shardrec spec infer` on one; the text's rules are
column_infer.py's).

A Parquet file (`infer_parquet_spec`) has its columns' names and types in its schema: the label
as given; a list of strings or integers makes a list (the longest list in the sample its
max_length); integers are read as text's integers are (dense, or an integer categorical where the
text would make a code: an id's or a C<n> name, one width of 4+ digits; Unix times ignored);
floats and booleans dense, but whole-number floats under an id's name (pandas's integer column
with nulls), which make the integer categorical of their ids; strings hex or string categoricals
(or ignored: row ids, empty); other types (timestamps, dates, structs) are ignored, with the type
said. Nulls are missing values.

Every choice is written beside its column as a comment, for the user to check and edit.
"""

from __future__ import annotations

from pathlib import Path

from shardrec.dataloader.spec.feature_spec import (
    CategoricalColumn,
    Column,
    DenseColumn,
    FeatureSpec,
    IgnoredColumn,
    LabelColumn,
    ListColumn,
)
from shardrec.dataloader.spec.text_format import TextFormat
from shardrec.tools.preprocess.infer.column_infer import (
    HEX,
    MAX_HEX_DIGITS,
    code_name,
    hash_size,
    propose_column,
)
from shardrec.tools.preprocess.infer.label_infer import (
    exact,
    label_column,
    no_label_column,
    parse_label,
    threshold_inside,
    threshold_wanted,
)


def _parquet_column(name: str, kind: str, values: list, rows: int) -> tuple[Column, str]:
    """The proposed column for a Parquet column of Arrow kind `kind` (parquet_schema.kind_of) and
    its sample's non-null values, and why."""
    if kind.startswith("list-"):
        items = [x for v in values for x in v if x is not None and x != ""]
        if not items:
            return IgnoredColumn(name), f"lists empty in all {rows:,} rows"
        longest = max(len(v) for v in values)
        texts = [
            str(x) if not isinstance(x, bytes) else x.decode("utf-8", "replace") for x in items
        ]
        element = "integer" if kind == "list-integer" else "string"
        widths = set(map(len, texts))
        if element == "string" and all(HEX.match(t) for t in texts):
            element = "hex" if min(widths) >= 8 and max(widths) <= MAX_HEX_DIGITS else element
        size, seen = hash_size(texts, element)
        note = f"a list of {kind[5:]}s, up to {longest} in a row; {seen}; pooling: sum or mean"
        column = ListColumn(name, kind=element, hash_size=size, max_length=max(1, min(longest, 64)))
        return column, note
    if kind == "float":  # quantities: a float is no code
        if not values:
            return IgnoredColumn(name), f"null in all {rows:,} rows"
        low = min(values)
        return DenseColumn(
            name, type="float", transform="log1p" if low >= 0 else "signed-log1p"
        ), f"floats, min {low:g}"
    if kind == "bool":
        values = [int(v) for v in values]
        kind = "integer"
    if kind in ("integer", "float", "string"):
        texts = [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in values]
        texts = [t for t in texts if t != ""]
        column, note = propose_column(name, texts, rows, "\t", integers=kind == "integer")
        if kind == "string" and isinstance(column, (DenseColumn, ListColumn)):
            # a Parquet reader takes numbers from number columns and lists from list columns
            size, seen = hash_size(texts)
            what = "numbers" if isinstance(column, DenseColumn) else "values with separators"
            return CategoricalColumn(
                name, kind="string", hash_size=size
            ), f"{what} stored as strings; {seen}"
        return column, note
    return IgnoredColumn(
        name
    ), f"{kind}: not a feature as it is (derive one, e.g. an hour or a day)"


def _float_ids(name: str, kind: str, values: list, exact: int, past_floats: bool = False) -> bool:
    """Whether a float column holds whole numbers under an id's name (`_id`, C<n>): ids that
    pandas wrote as floats because the column has nulls (int64 has no null), all below 2^exact
    (the column's type's last exact integer, parquet_schema.FLOAT_EXACT_BITS), or with
    `past_floats` some at or past it (where floats skip integers: an integer categorical refuses
    them)."""
    if kind != "float" or not code_name(name) or not values:
        return False
    if not all(float(v).is_integer() for v in values):
        return False
    return any(abs(v) >= 2**exact for v in values) == past_floats


def rounded_ids_advice(columns: list[tuple[str, int, int]]) -> str:
    """The warning for id-named float columns of whole numbers at or past their type's last exact
    integer (_float_ids), each given as (name, its float's bit width, that integer's power of 2)."""
    named = ", ".join(
        f"{n} (float{bits}: exact only below 2^{exact})" for n, bits, exact in columns
    )
    return (
        f"{named}: whole numbers at or past that bound stored as floats under an id's name (pandas "
        "writes an integer column that has nulls as float64): floats skip integers there, so ids "
        "that large may have been rounded as they became floats; proposed dense: keep the column "
        'integers where it is written (pandas: the nullable "Int64" dtype) and infer again'
    )


def _float_ids_column(name: str, values: list, rows: int) -> tuple[Column, str]:
    """The column proposed for _float_ids: the integer categorical that the same ids written as
    integers make, which reads each float as the integer it is."""
    column, note = _parquet_column(name, "integer", [int(v) for v in values], rows)
    shown = int(values[0])
    return column, (
        f"{note}; whole numbers stored as floats (as pandas writes an integer column that has "
        f'nulls): kind = "integer" reads {float(shown)} as {shown}, the id an integer column '
        "of it gives"
    )


def infer_parquet_spec(
    path: Path, label: str, rows: int = 10_000
) -> tuple[FeatureSpec, dict[str, str], list[str]]:
    """A spec for a Parquet file from its schema and first `rows` rows, a note per column
    saying why (module doc), and the warnings of its guesses (float_ids_advice). ValueError names
    what does not fit."""
    import pyarrow.parquet as pq

    from shardrec.tools.preprocess.parse.parquet_schema import (
        FLOAT_EXACT_BITS,
        float_bits,
        kind_of,
    )

    try:
        f = pq.ParquetFile(path)
    except Exception as e:  # pyarrow's ArrowInvalid, OSError: not a Parquet file it reads
        raise ValueError(f"{path}: not a readable Parquet file ({e})") from None
    schema = f.schema_arrow
    names = list(schema.names)
    batch = next(f.iter_batches(batch_size=rows, use_threads=False), None)
    sample = batch.to_pydict() if batch is not None else {n: [] for n in names}
    count = batch.num_rows if batch is not None else 0
    label_name, threshold = parse_label(label)
    if label_name not in names and label_name.isdigit() and int(label_name) < len(names):
        label_name = names[int(label_name)]
    if label_name not in names:
        raise no_label_column(path, label_name, names)
    columns, notes, rounded = [], {}, []
    for name in names:
        kind = kind_of(schema.field(name).type)
        values = [v for v in sample[name] if v is not None]
        if name == label_name and kind == "string":  # words: a mapping, as a CSV's are read
            column, notes[name] = label_column(name, values, threshold, path)
            columns.append(column)
            continue
        if name == label_name:
            shown = sorted({str(v) for v in values})[:5]
            if kind not in ("integer", "float", "bool"):
                raise ValueError(
                    f"{path}: label column {name!r} is {schema.field(name).type}; a label is a "
                    "number (0/1, or any number with a threshold) or a string of two values"
                )
            if threshold is None and not {float(v) for v in values} <= {0.0, 1.0}:
                raise ValueError(threshold_wanted(path, name, [float(v) for v in values], shown))
            if threshold is not None and values:
                threshold_inside(path, name, [float(v) for v in values], threshold)
            columns.append(LabelColumn(name, threshold=threshold))
            notes[name] = "the label" + (
                f": 1 where {name} >= {exact(threshold)}" if threshold is not None else ""
            )
            continue
        width = float_bits(schema.field(name).type) or 64
        bound = FLOAT_EXACT_BITS[width]
        if _float_ids(name, kind, values, bound):
            column, notes[name] = _float_ids_column(name, values, count)
        else:
            column, notes[name] = _parquet_column(name, kind, values, count)
        if _float_ids(name, kind, values, bound, past_floats=True):
            rounded.append((name, width, bound))
        if name in ("label", "dense"):  # a feature cannot take a part's own column names
            column, notes[name] = (
                IgnoredColumn(name),
                "named like a part's own column; rename it to use it",
            )
        columns.append(column)
    advice = [rounded_ids_advice(rounded)] if rounded else []
    return FeatureSpec(TextFormat("parquet"), tuple(columns)), notes, advice
