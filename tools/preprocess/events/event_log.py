"""An event log read whole and checked: its columns by the event spec, grouped by user in time
order, with each event's action bit (listen-plus, like, skip).

Bad input stops here in one line naming the file, the row (Parquet: its index from 0; CSV/TSV:
the line, the header being line 1), the column and the value, and what to do:

    events.parquet: row 1234: timestamp: 1700 is before 1705, the previous event of user 17;
    events must be in time order within each user
    events.parquet: column 'played_ratio_pct' not found (columns: uid, item_id, ...); set
    events.played_ratio in spec.toml
    events.parquet: row 9: item_id: 9400000 is not an item of artist_item_mapping.parquet
    (9,390,624 items)
    events.csv:41: expected 7 fields, got 8 (as many as the header's columns, line 1; quote a
    value that holds a comma)

Memory: the columns it reads (user, item and time as int64, type, played ratio, organic) for the
whole log, about 34 bytes an event while it is grouped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardrec.dataloader.events.history_kernels import LIKE, LISTEN_PLUS, SKIP
from shardrec.dataloader.spec.event_spec import MEANINGS, EventSpec, ItemMap
from shardrec.tools.preprocess.events.log_text import (
    arrow_message,
    binary_content,
    field_count_line,
    is_text,
)


class EventLogError(ValueError):
    """An event log, or an item map, that cannot make a dataset; the message names the place."""


@dataclass
class EventLog:
    """Events grouped by user (users ascending), each user's in time order (ties in file order)."""

    user: np.ndarray
    """[U] user ids, ascending."""
    offsets: np.ndarray
    """[U + 1] where each user's events start."""
    item: np.ndarray
    ts: np.ndarray
    action: np.ndarray
    """LISTEN_PLUS, LIKE, SKIP or 0 (in no pool: dislikes, unlikes, undislikes)."""
    listen: np.ndarray
    """The event is a listen (a sample where it has enough history)."""
    organic: np.ndarray
    artist: np.ndarray
    """Of each item (0: no map or not in it)."""
    album: np.ndarray
    rows: int
    """Events read."""
    row: np.ndarray
    """Each event's row in the input (the files in order, from 0)."""


@dataclass
class _Source:
    """Where each read row came from, for messages."""

    files: list[Path]
    ends: np.ndarray
    """Rows read up to and including each file."""
    csv: bool

    def file_at(self, row: int) -> Path:
        """The file that holds `row`."""
        return self.files[int(np.searchsorted(self.ends, row, side="right"))]

    def where(self, row: int) -> str:
        f = int(np.searchsorted(self.ends, row, side="right"))
        local = row - (int(self.ends[f - 1]) if f else 0)
        # Text as the click-log reader says it (file:line, the header being line 1); Parquet has
        # rows, not lines.
        return f"{self.files[f]}:{local + 2}" if self.csv else f"{self.files[f]}: row {local}"


def _read_table(
    path: Path, kind: str, wanted: dict[str, str], spec_path: Path | None, told: tuple[str, str]
):
    """The table of the columns `wanted` (spec key -> column name) of one file; `spec_path` None:
    the spec is a model's, which no one edits. `told`: where `kind` came from, and what to do when
    the file is in the other format after all, Parquet or text (for a refusal)."""
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
    try:
        if kind == "parquet":
            names = pq.ParquetFile(path).schema_arrow.names
        else:
            delimiter = "\t" if kind == "tsv" else ","
            options = pcsv.ParseOptions(delimiter=delimiter)
            with pcsv.open_csv(path, parse_options=options) as reader:
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
        return pcsv.read_csv(
            path,
            parse_options=pcsv.ParseOptions(delimiter="\t" if kind == "tsv" else ","),
            convert_options=pcsv.ConvertOptions(include_columns=columns, column_types=strings),
        )
    except pa.ArrowException as e:
        raise _unreadable(path, kind, e) from None


def _unreadable(path: Path, kind: str, error: Exception) -> EventLogError:
    """The refusal of a file pyarrow cannot read: a text line's field count names its line."""
    line = field_count_line(path, kind, error) if kind != "parquet" else None
    return EventLogError(line or f"{path}: cannot read it as {kind}: {arrow_message(error)}")


ID_LIMIT = (1 << 32) - 1
"""The largest user, item, artist or album id: the dataset keeps them as uint32 (an id is a row
of its table), so a larger one would wrap onto another's row."""
_INT64_LIMIT = (1 << 63) - 1


def _integers(
    values, name: str, source: _Source, offset: int, largest: int = _INT64_LIMIT, what: str = ""
) -> np.ndarray:
    """A column as int64; the first null, non-integer, negative or above-`largest` value is
    refused (`what`: what the value is, for that refusal: `user id`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
        try:
            values = pc.cast(values, pa.int64())
        except pa.ArrowInvalid:
            for i, v in enumerate(values.to_pylist()):
                if v == "":
                    raise EventLogError(
                        f"{source.where(offset + i)}: {name}: empty (every event needs one)"
                    ) from None
                try:
                    number = int(v)
                except (TypeError, ValueError):
                    raise EventLogError(
                        f"{source.where(offset + i)}: {name}: {v!r} is not an integer"
                    ) from None
                if number > largest:
                    raise _too_large(
                        source.where(offset + i), name, number, largest, what
                    ) from None
            raise
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


def _ratios(values, name: str, source: _Source, offset: int) -> np.ndarray:
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
        for i, v in enumerate(values.to_pylist()):
            try:
                float(v if v is not None else "nan")
            except ValueError:
                raise EventLogError(
                    f"{source.where(offset + i)}: {name}: {v!r} is not a number (the percent "
                    "played)"
                ) from None
        raise


def _too_large(where: str, name: str, value: int, largest: int, what: str) -> EventLogError:
    return EventLogError(
        f"{where}: {name}: {value} is past {largest:,}, the largest {what or 'value'} an "
        "event-log dataset holds"
        + ("; renumber them from 0 (an id is a row of its table)" if what else "")
    )


def _map_path(spec_path: Path, name: str, entry: ItemMap) -> Path:
    """Where the spec's map `name` is; refused, naming its key, where there is no such file."""
    path = Path(entry.file)
    path = path if path.is_absolute() else spec_path.parent / path
    if not path.exists():
        raise EventLogError(
            f"{spec_path}: items.{name}.file = {entry.file!r}: {path} does not exist (a relative "
            "path is read from the spec's folder); fix the path"
        )
    return path


def _item_map(spec_path: Path, name: str, entry: ItemMap) -> tuple[np.ndarray, np.ndarray, str]:
    """(items, their value) of one map file, and its path as shown."""
    path = _map_path(spec_path, name, entry)
    kind = "parquet" if path.suffix == ".parquet" else ("tsv" if path.suffix == ".tsv" else "csv")
    table = _read_table(
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
    source = _Source([path], np.array([table.num_rows]), kind != "parquet")
    items = _integers(
        table.column(entry.item).combine_chunks(), entry.item, source, 0, ID_LIMIT, "item id"
    )
    values = _integers(
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


def read_event_log(
    paths: list[Path],
    spec: EventSpec,
    spec_path: Path | None,
    maps: tuple[np.ndarray, np.ndarray] | None = None,
) -> EventLog:
    """Read and check the log's files (in this order) and the spec's item maps (or `maps`, each
    item's artist and album, as a model file holds them). `spec_path`: the spec's file, which
    messages tell the user to edit; None for a model's spec (with its `maps`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    cols = spec.events
    wanted = {
        "events.user": cols.user,
        "events.item": cols.item,
        "events.timestamp": cols.timestamp,
        "events.type": cols.type,
        "events.played_ratio": cols.played_ratio,
    }
    if cols.organic:
        wanted["events.organic"] = cols.organic
    if maps is None:  # a missing map before the log is read, not after
        assert spec_path is not None, "a model's spec comes with its maps"
        for name, entry in spec.items.items():
            _map_path(spec_path, name, entry)
    other = (
        'set kind = "csv" there for comma-separated text with a header ("tsv": tab-separated)'
        if spec.format == "parquet"
        else 'set kind = "parquet" there'
    )
    told = (
        (f'[format] kind = "{spec.format}" in {spec_path}', other)
        if spec_path is not None
        else (
            f"the model's event spec reads {spec.format}",
            "score a log in the format of the log the model was trained on",
        )
    )
    tables = [_read_table(p, spec.format, wanted, spec_path, told) for p in paths]
    ends = np.cumsum([t.num_rows for t in tables])
    source = _Source(list(paths), ends, spec.format != "parquet")
    parts: dict[str, list[np.ndarray]] = {
        k: [] for k in ("user", "item", "ts", "type", "played", "organic")
    }
    meanings = list(cols.types)
    spec_shown = spec_path if spec_path is not None else "the model's event spec"
    written = pa.array([cols.types[m] for m in meanings])
    for table, first in zip(tables, [0, *ends[:-1].tolist()]):
        table = table.combine_chunks()
        for key, column, what in (("user", cols.user, "user id"), ("item", cols.item, "item id")):
            ids = _integers(table.column(column), column, source, first, ID_LIMIT, what)
            parts[key].append(ids)
        parts["ts"].append(_integers(table.column(cols.timestamp), cols.timestamp, source, first))
        kinds = pc.cast(table.column(cols.type), pa.string())
        index = pc.index_in(kinds, value_set=written)
        if index.null_count:
            i = int(np.argmax(~np.asarray(pc.is_valid(index))))
            raise EventLogError(
                f"{source.where(first + i)}: {cols.type}: {kinds[i].as_py()!r} is not one of "
                f"{', '.join(cols.types.values())} ([events.types] in {spec_shown})"
            )
        code = np.array([MEANINGS.index(m) for m in meanings], np.uint8)
        parts["type"].append(code[np.asarray(index, dtype=np.int64)])
        parts["played"].append(
            _ratios(table.column(cols.played_ratio), cols.played_ratio, source, first)
        )
        if cols.organic:
            organic = _integers(table.column(cols.organic), cols.organic, source, first)
            parts["organic"].append(np.minimum(organic, 1).astype(np.uint8))
        else:
            parts["organic"].append(np.zeros(table.num_rows, np.uint8))
    col = {k: np.concatenate(v) if v else np.zeros(0) for k, v in parts.items()}
    rows = len(col["user"])
    if rows == 0:
        raise EventLogError(f"{paths[0]}: no events")
    listen = col["type"] == MEANINGS.index("listen")
    unplayed = np.flatnonzero(listen & np.isnan(col["played"]))
    if len(unplayed):  # it would be a skip: a label 0 and a history event of the wrong pool
        raise EventLogError(
            f"{source.where(int(unplayed[0]))}: {cols.played_ratio}: empty for a listen "
            f"({len(unplayed):,} listens have none); a listen's percent played makes its label and "
            "its pool in later histories: fill it, or leave such rows out"
        )
    if maps is None:
        assert spec_path is not None
        artist, album = _maps(spec, spec_path, col["item"], source)
    else:
        artist, album = maps
        outside = np.flatnonzero(col["item"] >= len(artist))
        if len(outside):
            i = int(outside[0])
            raise EventLogError(
                f"{source.where(i)}: {cols.item}: {col['item'][i]} is not an item the model knows "
                f"({len(artist):,} items)"
            )
    # Users ascending, each user's events in file order: a stable sort.
    order = np.argsort(col["user"], kind="stable")
    user, ts = col["user"][order], col["ts"][order]
    back = np.flatnonzero((np.diff(ts) < 0) & (np.diff(user) == 0))
    if len(back):
        i = int(back[0])
        raise EventLogError(
            f"{source.where(int(order[i + 1]))}: {cols.timestamp}: {ts[i + 1]} is before "
            f"{ts[i]}, the previous event of user {user[i]}; events must be in time order within "
            "each user (sort the log by user and time)"
        )
    kind, played, listen = col["type"][order], col["played"][order], listen[order]
    plus = listen & (played >= spec.played_ratio_min)
    action = np.where(plus, LISTEN_PLUS, np.where(listen, SKIP, 0)).astype(np.uint8)
    action[kind == MEANINGS.index("like")] = LIKE
    users, starts = np.unique(user, return_index=True)
    return EventLog(
        user=users,
        offsets=np.append(starts, rows).astype(np.int64),
        item=col["item"][order],
        ts=ts,
        action=action,
        listen=listen,
        organic=col["organic"][order],
        artist=artist,
        album=album,
        rows=rows,
        row=order,
    )


def _maps(
    spec: EventSpec, spec_path: Path, item: np.ndarray, source: _Source
) -> tuple[np.ndarray, np.ndarray]:
    """Each item's artist and album (zeros without a map); an event's item outside a map is
    refused, and item ids too large for these arrays in memory (an id is their row)."""
    count, largest = (
        int(item.max()) + 1,
        f"{source.where(int(np.argmax(item)))}: {spec.events.item}",
    )
    found = {}
    for name in ("artist", "album"):
        if name not in spec.items:
            continue
        items, values, shown = _item_map(spec_path, name, spec.items[name])
        size = int(items.max()) + 1 if len(items) else 0
        outside = np.flatnonzero(item >= size)
        if len(outside):
            i = int(outside[0])
            raise EventLogError(
                f"{source.where(i)}: {spec.events.item}: {item[i]} is not an item of {shown} "
                f"({size:,} items)"
            )
        found[name] = (items, values)
        if size > count:
            count, largest = size, f"{shown}: {spec.items[name].item}"
    try:
        arrays = tuple(np.zeros(count, np.int64) for _ in range(2))
    except MemoryError:
        raise EventLogError(
            f"{largest}: {count - 1} makes item tables of {count:,} rows, whose artist and album "
            f"({2 * 8 * count / 2**30:,.1f} GiB) do not fit in memory; renumber the items from 0 "
            "(an id is a row of its table)"
        ) from None
    for array, name in zip(arrays, ("artist", "album")):
        if name in found:
            array[found[name][0]] = found[name][1]
    return arrays  # type: ignore[return-value]
