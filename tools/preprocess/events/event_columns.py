"""An event log's columns read and checked, one file at a time: the table of the columns the spec
names, integer ids and seconds, played ratios, and the item maps (artist, album). Each refusal
names the file, the row or line, the column and the value (event_log.py's docstring shows them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardrec.dataloader.spec.event_spec import ItemMap
from shardrec.dataloader.spec.missing_words import missing_word_hint
from shardrec.tools.preprocess.events.log_text import (
    arrow_message,
    binary_content,
    field_count_line,
    is_text,
    row_line,
    text_before_blank_lines,
)


class EventLogError(ValueError):
    """An event log, or an item map, that cannot make a dataset; the message names the place."""


@dataclass
class Source:
    """Where each read row came from, for messages."""

    files: list[Path]
    ends: np.ndarray
    """Rows read up to and including each file."""
    csv: bool
    missing: tuple[str, ...] = ()
    """A text log's words for a missing value (`[format] missing`)."""

    def file_at(self, row: int) -> Path:
        """The file that holds `row`."""
        return self.files[int(np.searchsorted(self.ends, row, side="right"))]

    def word_hint(self, value: str) -> str:
        """What a refusal of `value` as a number adds where it is a word for a missing value the
        spec does not list (text only: Parquet's missing values are nulls)."""
        return missing_word_hint(value, self.missing) if self.csv else ""

    def where(self, row: int) -> str:
        f = int(np.searchsorted(self.ends, row, side="right"))
        local = row - (int(self.ends[f - 1]) if f else 0)
        # Text as the click-log reader says it (file:line); Parquet has rows, not lines.
        if self.csv:
            return f"{self.files[f]}:{row_line(self.files[f], local)}"
        return f"{self.files[f]}: row {local}"


def read_table(
    path: Path,
    kind: str,
    wanted: dict[str, str],
    spec_path: Path | None,
    told: tuple[str, str],
    missing: tuple[str, ...] = (),
):
    """The table of the columns `wanted` (spec key -> column name) of one file; `spec_path` None:
    the spec is a model's, which no one edits. `told`: where `kind` came from, and what to do when
    the file is in the other format after all, Parquet or text (for a refusal). `missing`: a text
    file's words for a missing value (`[format] missing`), each field that is one read as empty."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    if kind != "parquet":
        content = binary_content(path)
        if content is not None:
            why, parquet_fix = told
            fix = (
                parquet_fix if content == "a Parquet file" else f"give a {kind} file with a header"
            )
            raise EventLogError(f"{path}: {content}, not {kind} text ({why}); {fix}")
    delimiter = "\t" if kind == "tsv" else ","
    options = pcsv.ParseOptions(delimiter=delimiter)
    try:
        if kind == "parquet":
            names = pq.ParquetFile(path).schema_arrow.names
        else:
            with (
                text_before_blank_lines(path, delimiter) as text,
                pcsv.open_csv(text, parse_options=options) as reader,
            ):
                names = reader.schema.names
    except (OSError, pa.ArrowException) as e:
        if kind == "parquet" and is_text(path):  # pyarrow would only say "magic bytes not found"
            why, text_fix = told
            raise EventLogError(f"{path}: text, not a Parquet file ({why}); {text_fix}") from None
        raise _unreadable(path, kind, e) from None
    for key, column in wanted.items():
        if column not in names:
            shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
            remedy = (
                f"set {key} in {spec_path}"
                if spec_path is not None
                else f"the model's event spec reads {key} from it: score a log with the columns "
                "of the log the model was trained on"
            )
            raise EventLogError(f"{path}: column {column!r} not found (columns: {shown}); {remedy}")
    columns = list(dict.fromkeys(wanted.values()))
    try:
        if kind == "parquet":
            return pq.read_table(path, columns=columns)
        strings = {c: pa.string() for c in columns}
        with text_before_blank_lines(path, delimiter) as text:
            table = pcsv.read_csv(
                text,
                parse_options=options,
                convert_options=pcsv.ConvertOptions(include_columns=columns, column_types=strings),
            )
    except pa.ArrowException as e:
        raise _unreadable(path, kind, e) from None
    return _emptied(table, missing) if missing else table


def _emptied(table, words: tuple[str, ...]):
    """`table` (text read as strings) with each field that is one of `words` made empty: the
    columns' readers below then take it as they take an empty field."""
    import pyarrow as pa
    import pyarrow.compute as pc

    found = pa.array(words, pa.string())
    return pa.table(
        [pc.if_else(pc.is_in(c, value_set=found), "", c) for c in table.columns],
        names=table.column_names,
    )


def _unreadable(path: Path, kind: str, error: Exception) -> EventLogError:
    """The refusal of a file pyarrow cannot read: a text line's field count names its line."""
    line = field_count_line(path, kind, error) if kind != "parquet" else None
    return EventLogError(line or f"{path}: cannot read it as {kind}: {arrow_message(error)}")


ID_LIMIT = (1 << 32) - 1
"""The largest user, item, artist or album id: the dataset keeps them as uint32 (an id is a row
of its table), so a larger one would wrap onto another's row."""
_INT64_LIMIT = (1 << 63) - 1


def integers(
    values, name: str, source: Source, offset: int, largest: int = _INT64_LIMIT, what: str = ""
) -> np.ndarray:
    """A column as int64; the first null, non-integer, negative or above-`largest` value is
    refused (`what`: what the value is, for that refusal: `user id`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        try:
            values = pc.cast(values, pa.int64())
        except pa.ArrowInvalid:
            i = _first_uncast(values, pa.int64())
            v, where = values[i].as_py(), source.where(offset + i)
            if v == "":
                raise EventLogError(f"{where}: {name}: empty (every event needs one)") from None
            if re.fullmatch("-?[0-9]+", v) is None:  # a sign, a space, a `_`: not as int() reads
                raise EventLogError(
                    f"{where}: {name}: {v!r} is not an integer{source.word_hint(v)}"
                ) from None
            if v.startswith("-"):  # digits past int64's
                raise EventLogError(f"{where}: {name}: {v} is negative") from None
            raise _too_large(where, name, int(v), largest, what) from None
    if values.null_count:
        i = int(np.argmax(~np.asarray(pc.is_valid(values))))
        raise EventLogError(f"{source.where(offset + i)}: {name}: empty (every event needs one)")
    if not pa.types.is_integer(values.type):
        raise EventLogError(
            f"{source.file_at(offset)}: {name} holds {values.type}, not integers (ids and seconds)"
        )
    above = pc.greater(values, pa.scalar(largest, pa.uint64()))
    if pc.any(above).as_py():
        i = int(np.argmax(np.asarray(above)))
        raise _too_large(source.where(offset + i), name, values[i].as_py(), largest, what)
    out = np.asarray(values.cast(pa.int64()), dtype=np.int64)
    negative = np.flatnonzero(out < 0)
    if len(negative):
        i = int(negative[0])
        raise EventLogError(f"{source.where(offset + i)}: {name}: {out[i]} is negative")
    return out


def _first_uncast(values, to) -> int:
    """The first of `values` that pyarrow cannot cast to `to` (one can't), by halves: its
    message names no row, and Python's int() and float() read what it refuses (` 5`, `1_0`)."""
    import pyarrow as pa

    lo, hi = 0, len(values)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            values.slice(lo, mid - lo).cast(to)
            lo = mid
        except pa.ArrowInvalid:
            hi = mid
    return lo


def ratios(values, name: str, source: Source, offset: int) -> np.ndarray:
    """The played-ratio column as float64, NaN where empty (an event that is no listen); the first
    value that is no number is refused."""
    import pyarrow as pa
    import pyarrow.compute as pc

    text = pa.types.is_string(values.type) or pa.types.is_large_string(values.type)
    if text:
        values = pc.if_else(pc.equal(values, ""), None, values)
    try:
        return np.asarray(pc.fill_null(values.cast(pa.float64()), np.nan))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        if not text:
            raise EventLogError(
                f"{source.file_at(offset)}: {name} holds {values.type}, not numbers (the percent played)"
            ) from None
        i = _first_uncast(values, pa.float64())
        v = values[i].as_py()
        raise EventLogError(
            f"{source.where(offset + i)}: {name}: {v!r} is not a number (the percent played)"
            f"{source.word_hint(v)}"
        ) from None


def _too_large(where: str, name: str, value: int, largest: int, what: str) -> EventLogError:
    return EventLogError(
        f"{where}: {name}: {value} is past {largest:,}, the largest {what or 'value'} an "
        "event-log dataset holds"
        + ("; renumber them from 0 (an id is a row of its table)" if what else "")
    )


def map_path(spec_path: Path, name: str, entry: ItemMap) -> Path:
    """Where the spec's map `name` is; refused, naming its key, where there is no such file."""
    path = Path(entry.file)
    path = path if path.is_absolute() else spec_path.parent / path
    if not path.exists():
        raise EventLogError(
            f"{spec_path}: items.{name}.file = {entry.file!r}: {path} does not exist (a relative "
            "path is read from the spec's folder); fix the path"
        )
    return path


def item_map(spec_path: Path, name: str, entry: ItemMap) -> tuple[np.ndarray, np.ndarray, str]:
    """(items, their value) of one map file, and its path as shown."""
    path = map_path(spec_path, name, entry)
    kind = "parquet" if path.suffix == ".parquet" else ("tsv" if path.suffix == ".tsv" else "csv")
    table = read_table(
        path,
        kind,
        {f"items.{name}.item": entry.item, f"items.{name}.value": entry.value},
        spec_path,
        (
            "an item map is read by its extension",
            f"name it {'.csv or .tsv' if kind == 'parquet' else '.parquet'} "
            f"(items.{name}.file in {spec_path})",
        ),
    )
    source = Source([path], np.array([table.num_rows]), kind != "parquet")
    items = integers(
        table.column(entry.item).combine_chunks(), entry.item, source, 0, ID_LIMIT, "item id"
    )
    values = integers(
        table.column(entry.value).combine_chunks(), entry.value, source, 0, ID_LIMIT, f"{name} id"
    )
    order = np.argsort(items, kind="stable")
    twice = np.flatnonzero(np.diff(items[order]) == 0)
    if len(twice):
        i = int(order[twice[0] + 1])
        raise EventLogError(
            f"{source.where(i)}: {entry.item}: item {items[i]} is mapped twice; keep one row per item"
        )
    return items, values, str(path)
