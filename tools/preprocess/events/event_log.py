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
from shardrec.dataloader.spec.event_spec import MEANINGS, EventSpec
from shardrec.tools.preprocess.events.event_columns import (
    ID_LIMIT,
    EventLogError,
    Source,
    integers,
    item_map,
    map_path,
    ratios,
    read_table,
)


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
            map_path(spec_path, name, entry)
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
    tables = [read_table(p, spec.format, wanted, spec_path, told, spec.missing) for p in paths]
    ends = np.cumsum([t.num_rows for t in tables])
    source = Source(list(paths), ends, spec.format != "parquet", spec.missing)
    parts: dict[str, list[np.ndarray]] = {
        k: [] for k in ("user", "item", "ts", "type", "played", "organic")
    }
    meanings = list(cols.types)
    spec_shown = spec_path if spec_path is not None else "the model's event spec"
    written = pa.array([cols.types[m] for m in meanings])
    for table, first in zip(tables, [0, *ends[:-1].tolist()]):
        table = table.combine_chunks()
        for key, column, what in (("user", cols.user, "user id"), ("item", cols.item, "item id")):
            ids = integers(table.column(column), column, source, first, ID_LIMIT, what)
            parts[key].append(ids)
        parts["ts"].append(integers(table.column(cols.timestamp), cols.timestamp, source, first))
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
            ratios(table.column(cols.played_ratio), cols.played_ratio, source, first)
        )
        if cols.organic:
            organic = integers(table.column(cols.organic), cols.organic, source, first)
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
    odd = np.flatnonzero(listen & (np.isinf(col["played"]) | (col["played"] < 0)))
    if len(odd):  # inf would be a listen-plus, a negative one a skip, without a word
        i = int(odd[0])
        raise EventLogError(
            f"{source.where(i)}: {cols.played_ratio}: {col['played'][i]:g} is no percent played "
            f"(0 or more; {len(odd):,} listens have such a value); a listen's percent played makes "
            "its label and its pool in later histories: fix it, or leave such rows out"
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
                f"{source.where(i)}: {cols.item}: {col['item'][i]} is beyond the model's "
                f"{len(artist):,} items (0 to {len(artist) - 1:,}), which each have a row of its "
                "item table: leave that item's events out, or score them with a model trained on "
                "item maps that hold it"
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
    spec: EventSpec, spec_path: Path, item: np.ndarray, source: Source
) -> tuple[np.ndarray, np.ndarray]:
    """Each item's artist and album (zeros without a map); an event's item outside a map is
    refused, and item ids too large for these arrays in memory (an id is their row)."""
    # A map's key where a map's largest item is the largest, else None: the log's, whose place is
    # named only in a refusal (Source.where reads a text log again).
    count, largest = int(item.max()) + 1, None
    found = {}
    for name in ("artist", "album"):
        if name not in spec.items:
            continue
        items, values, shown = item_map(spec_path, name, spec.items[name])
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
        largest = largest or f"{source.where(int(np.argmax(item)))}: {spec.events.item}"
        raise EventLogError(
            f"{largest}: {count - 1} makes item tables of {count:,} rows, whose artist and album "
            f"({2 * 8 * count / 2**30:,.1f} GiB) do not fit in memory; renumber the items from 0 "
            "(an id is a row of its table)"
        ) from None
    for array, name in zip(arrays, ("artist", "album")):
        if name in found:
            array[found[name][0]] = found[name][1]
    return arrays  # type: ignore[return-value]
