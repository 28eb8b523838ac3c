"""An event-log dataset on disk: one Arrow IPC file per part of users, the item maps, and one
timeline of anchors per split, each checksummed in the manifest.

    DIR/manifest.json                kind "events"; its `events` block (EventsInfo) lists the files
    DIR/events/part-00000.arrow      one row per user: uid, and per event (time order, lists that
                                     share the user's offsets) item, ts, action, organic
    DIR/items.arrow                  artist, album of each item (row = item id)
    DIR/<split>/timeline.arrow       the split's anchors: part, user (row in the part), event
                                     (place in the user's events), in (window, part, user, event)
                                     order; `EventsInfo.windows[split]` the offset of each window

Nothing per sample is materialised: a sample is an anchor, its history gathered from its user's
events when the batch is made (history_kernels.py). Files are written under a temporary name and
renamed; the loader maps them read-only (pyarrow's memory map: pages are read as the stream
reaches them) and checks each file's size, schema and rows against the manifest when it opens
it; `shardrec data verify` checks every checksum.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.dataloader.events.history_kernels import LIKE, LISTEN_PLUS, SKIP
from shardrec.dataloader.format.dataset_files import file_sha256, inside_dataset
from shardrec.dataloader.format.manifest import DatasetError, Manifest, shown
from shardrec.dataloader.format.part_file import ChangedFileError
from shardrec.dataloader.util.files import atomic_path

EVENTS_KIND = "events"
EVENTS_DIR = "events"
ITEMS_FILE = "items.arrow"
TIMELINE_FILE = "timeline.arrow"
EVENT_COLUMNS = ("item", "ts", "action", "organic")
"""Per-event lists of a part, in this order after `uid`."""


@dataclass
class EventFile:
    """One file as the manifest records it: its path inside the dataset, rows, size, SHA-256."""

    name: str
    rows: int
    bytes: int
    sha256: str


@dataclass
class EventsInfo:
    """The manifest's `events` block: the files, the windows, what the samples were made with."""

    parts: list[EventFile]
    items: EventFile
    timelines: dict[str, EventFile]
    windows: dict[str, list[int]]
    """Split -> the timeline row where each of its windows starts, then its end."""
    window_ids: dict[str, list[int]]
    """Split -> the number of each of its windows, counted from `t_min`."""
    t_min: int
    """The earliest anchor's time: window w holds anchors in [t_min + w s, t_min + (w + 1) s)."""
    users: int
    events: int
    spec: dict[str, Any] = field(default_factory=dict)
    """The event spec (dataloader/spec/event_spec.py), as plain data."""
    statistics: dict[str, Any] = field(default_factory=dict)
    """Anchors per split and window, history lengths kept, positive rate."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> EventsInfo:
        """KeyError or TypeError (naming the entry) for a malformed block."""
        files = {k: raw[k] for k in ("parts", "items", "timelines")}
        return cls(
            parts=[EventFile(**p) for p in files["parts"]],
            items=EventFile(**files["items"]),
            timelines={k: EventFile(**v) for k, v in files["timelines"].items()},
            **{k: v for k, v in raw.items() if k not in files},
        )

    def files(self) -> list[EventFile]:
        return [*self.parts, self.items, *self.timelines.values()]


def events_info(manifest: Manifest, directory: Path) -> EventsInfo:
    """The manifest's `events` block, its windows checked against its timelines: DatasetError in
    one line naming the manifest for a malformed block. The loader cuts a split's timeline at its
    windows, and `train` sizes its epochs by the split's rows: windows past the timeline's rows
    would index outside it, and out of order ones or another count would train another stream."""
    where = directory / "manifest.json"
    try:
        info = EventsInfo.from_dict(manifest.events)
    except (KeyError, TypeError) as e:
        raise DatasetError(f"{where}: malformed events: {e}") from None
    for split in info.timelines:
        problem = _windows_problem(split, info, manifest.splits.get(split))
        if problem:
            raise DatasetError(
                f"{where}: malformed events: {problem}; re-run the command that made the dataset, "
                "into it, to write its manifest again"
            )
    return info


def _windows_problem(split: str, info: EventsInfo, rows: Any) -> str | None:
    timeline = info.timelines[split]
    anchors = f"{timeline.name} holds {timeline.rows} anchors"
    bounds, ids = info.windows.get(split), info.window_ids.get(split)
    if (
        not isinstance(bounds, list)
        or not all(type(b) is int for b in bounds)
        or bounds[:1] != [0]
        or any(b > c for b, c in zip(bounds, bounds[1:]))
    ):
        return f"windows.{split} is {shown(bounds, 60)}, expected timeline rows in order from 0"
    if bounds[-1] != timeline.rows:
        return f"windows.{split} ends at {bounds[-1]}, but {anchors}"
    if getattr(rows, "rows", None) != timeline.rows:
        return f"splits.{split}.rows is {getattr(rows, 'rows', None)}, but {anchors}"
    if not isinstance(ids, list) or len(ids) != len(bounds) - 1:
        return (
            f"window_ids.{split} is {shown(ids, 60)}, expected one per window ({len(bounds) - 1})"
        )
    return None


def _schema(kind: str):
    import pyarrow as pa

    lists = {
        "item": pa.uint32(),
        "ts": pa.int64(),
        "action": pa.uint8(),
        "organic": pa.uint8(),
    }
    if kind == "part":
        fields = [pa.field("uid", pa.uint32(), nullable=False)]
        fields += [
            pa.field(n, pa.large_list(pa.field("item", t, nullable=False)), nullable=False)
            for n, t in lists.items()
        ]
        return pa.schema(fields)
    if kind == "items":
        return pa.schema([pa.field(n, pa.uint32(), nullable=False) for n in ("artist", "album")])
    return pa.schema([pa.field(n, pa.uint32(), nullable=False) for n in ("part", "user", "event")])


def _write(path: Path, directory: Path, kind: str, columns: list) -> EventFile:
    import pyarrow as pa

    schema = _schema(kind)
    batch = pa.record_batch(columns, schema=schema)
    with atomic_path(path) as tmp:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            writer.write_batch(batch)
        digest = file_sha256(tmp)
        size = tmp.stat().st_size
    return EventFile(str(path.relative_to(directory)), batch.num_rows, size, digest)


def write_part(
    directory: Path, index: int, uid: np.ndarray, offsets: np.ndarray, events: dict[str, np.ndarray]
) -> EventFile:
    """One part of users: uid [U], their event offsets [U + 1] (from 0) and per-event columns."""
    import pyarrow as pa

    off = pa.array(offsets.astype(np.int64))
    schema = _schema("part")
    lists = []
    for name in EVENT_COLUMNS:
        kind = schema.field(name).type
        values = pa.array(events[name].astype(kind.value_type.to_pandas_dtype()))
        lists.append(pa.LargeListArray.from_arrays(off, values, type=kind))
    path = directory / EVENTS_DIR / f"part-{index:05d}.arrow"
    return _write(path, directory, "part", [pa.array(uid.astype(np.uint32)), *lists])


def write_items(directory: Path, artist: np.ndarray, album: np.ndarray) -> EventFile:
    import pyarrow as pa

    columns = [pa.array(a.astype(np.uint32)) for a in (artist, album)]
    return _write(directory / ITEMS_FILE, directory, "items", columns)


def write_timeline(
    directory: Path, split: str, part: np.ndarray, user: np.ndarray, event: np.ndarray
) -> EventFile:
    import pyarrow as pa

    columns = [pa.array(a.astype(np.uint32)) for a in (part, user, event)]
    return _write(directory / split / TIMELINE_FILE, directory, "timeline", columns)


@dataclass
class EventPart:
    """One part's columns, mapped: uid [U], offsets [U + 1], and the per-event arrays."""

    uid: np.ndarray
    offsets: np.ndarray
    item: np.ndarray
    ts: np.ndarray
    action: np.ndarray
    organic: np.ndarray


def _open(directory: Path, entry: EventFile, kind: str):
    """The file's one record batch, mapped, after checking its size, schema and rows."""
    import pyarrow as pa

    path = directory / entry.name
    if not path.is_file():
        raise DatasetError(f"{path}: missing (named by {directory / 'manifest.json'})")
    inside_dataset(directory, path)
    size = path.stat().st_size
    if size != entry.bytes:
        raise ChangedFileError(
            f"{path}: {size} bytes on disk, manifest says {entry.bytes} (truncated or replaced?)",
            directory,
        )
    try:
        reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
        if reader.num_record_batches != 1:
            raise ChangedFileError(
                f"{path}: {reader.num_record_batches} record batches, expected 1", directory
            )
        batch = reader.get_batch(0)
    except pa.ArrowInvalid as e:
        raise ChangedFileError(f"{path}: not a readable Arrow file: {e}", directory) from None
    except OSError as e:
        raise DatasetError(f"{path}: not a readable Arrow file: {e}") from None
    if not batch.schema.equals(_schema(kind)):
        raise ChangedFileError(
            f"{path}: columns {batch.schema.names} are not an event {kind}'s", directory
        )
    if batch.num_rows != entry.rows:
        raise ChangedFileError(
            f"{path}: {batch.num_rows} rows, manifest says {entry.rows}", directory
        )
    return batch


def _view(array) -> np.ndarray:
    return array.to_numpy(zero_copy_only=True)


def open_part(directory: Path, entry: EventFile) -> EventPart:
    batch = _open(directory, entry, "part")
    lists = {name: batch.column(name) for name in EVENT_COLUMNS}
    offsets = _view(lists["item"].offsets)
    for name, column in lists.items():
        if not np.array_equal(_view(column.offsets), offsets):
            raise DatasetError(f"{directory / entry.name}: {name} is not aligned with item")
    _check_user_offsets(directory / entry.name, offsets, [len(c.values) for c in lists.values()])
    return EventPart(
        uid=_view(batch.column("uid")),
        offsets=offsets,
        **{name: _view(column.values) for name, column in lists.items()},
    )


def _check_user_offsets(path: Path, offsets: np.ndarray, events: list[int]) -> None:
    """DatasetError unless the users' offsets run in order from 0 to the events every column
    holds: pyarrow reads a list's offsets as they are, and the compiled history gather, which
    reads a user's events from them unchecked, would read outside the file's buffers. One pass
    over the part's users (far fewer than its events) at open."""
    total = int(offsets[-1]) if len(offsets) else 0
    if (
        len(offsets)
        and int(offsets[0]) == 0
        and all(n == total for n in events)
        and bool((offsets[1:] >= offsets[:-1]).all())
    ):
        return
    raise DatasetError(
        f"{path}: its users' event offsets do not run in order from 0 to its {max(events, default=0):,} "
        "events (the file disagrees with its manifest: rebuild it with `shardrec preprocess`)"
    )


def open_items(directory: Path, entry: EventFile) -> tuple[np.ndarray, np.ndarray]:
    batch = _open(directory, entry, "items")
    return _view(batch.column("artist")), _view(batch.column("album"))


def check_table_ids(
    directory: Path,
    manifest: Manifest,
    parts: list[EventPart],
    maps: dict[str, np.ndarray],
) -> None:
    """DatasetError (one line) for a user or an item map's artist or album at or past its table's
    rows (a changed byte): such an id reached the model, where fbgemm's bounds check stopped the
    rank with 'RuntimeError: Expected idx < num_rows' and no file named. One pass over the users and
    the items at open (the events themselves are checked as each batch reads them)."""
    info = EventsInfo.from_dict(manifest.events)
    tables = {f.name: (f.table or f.name, int(f.cardinality)) for f in manifest.sparse_features}
    columns = [(directory / e.name, "uid", "uid", p.uid) for e, p in zip(info.parts, parts)]
    columns += [(directory / info.items.name, n, f"cand_{n}", v) for n, v in maps.items()]
    for path, column, feature, values in columns:
        table, limit = tables.get(feature, (feature, None))
        if limit is None or not values.size or int(values.max()) < limit:
            continue
        row = int(np.argmax(values >= limit))
        raise DatasetError(
            f"{path}: column {column}, row {row} has id {int(values[row])}, outside table {table} "
            f"of {limit} rows (the file disagrees with its manifest; `shardrec data verify` names "
            "it)"
        )


ACTION_CODES = (0, LISTEN_PLUS, LIKE, SKIP)
"""An event's action as a part stores it: 0 (in no pool: dislikes, unlikes, undislikes) or its
pool's bit; a listen's label is whether it is listen-plus."""


def check_actions(directory: Path, manifest: Manifest, parts: list[EventPart]) -> None:
    """DatasetError (one line) for an action that is no action code (a changed byte): a listen's
    label and every history's pools are read from them, and another value would train as a skip
    and leave its event out of the pools, without a word. One pass over the actions at open."""
    info = EventsInfo.from_dict(manifest.events)
    for entry, part in zip(info.parts, parts):
        action = part.action
        bad = ~np.isin(action, ACTION_CODES, kind="table")
        if action.size and bad.any():
            row = int(np.argmax(bad))
            raise DatasetError(
                f"{directory / entry.name}: column action, row {row} holds {int(action[row])}, no "
                f"action code ({', '.join(map(str, ACTION_CODES))}): the file disagrees with its "
                "manifest; `shardrec data verify` names it"
            )


def open_timeline(directory: Path, entry: EventFile) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    batch = _open(directory, entry, "timeline")
    return tuple(_view(batch.column(n)) for n in ("part", "user", "event"))  # type: ignore[return-value]


def verify_files(directory: Path, info: EventsInfo) -> list[str]:
    """Every file's size and SHA-256 against the manifest, and each part opened as the loader opens
    it (a part rewritten with its checksum recorded anew): one line per file that differs."""
    bad = []
    for entry in info.files():
        path = directory / entry.name
        if not path.is_file():
            bad.append(f"{path}: missing")
        elif path.stat().st_size != entry.bytes:
            bad.append(f"{path}: {path.stat().st_size} bytes, manifest says {entry.bytes}")
        elif file_sha256(path) != entry.sha256:
            bad.append(f"{path}: sha256 differs from the manifest's")
    for entry in info.parts:  # what opening checks of a part whose checksum was recorded anew
        if not any(line.startswith(f"{directory / entry.name}:") for line in bad):
            try:
                open_part(directory, entry)
            except ChangedFileError as e:  # without its advice: verify's report gives its own
                bad.append(e.problem)
            except DatasetError as e:
                bad.append(str(e))
    return bad
