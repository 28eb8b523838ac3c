"""The event spec: what an event log's columns are and how its samples are made (`shardrec
preprocess --events SPEC`), read from TOML and kept in the dataset's manifest.

An event log has one row per event of a user (a listen, a like, ...): user, item, time, event
type, and for listens how much was played. A sample is an *anchor*, a listen with at least
`min_history` earlier events of its user; its label is whether it was played past
`played_ratio_min` percent (a listen-plus); its inputs are the user, the anchor's item (with its
artist and album, from item maps), hashed crosses of those, and the user's earlier events (the
history, gathered when the batch is made). Samples are cut into windows of wall-clock time; the
last `holdout_windows` windows are the evaluation split (val), as DLRMv4's reference holds out
its last day; `test_seconds` > 0 sets the log's last seconds (after a gap) apart as test.

    [format]
    kind = "parquet"                  # parquet, csv or tsv (with a header)
    missing = []                      # text: words read as an empty field, such as ["NA", "\\N"]

    [events]                          # column names (Yambda's by default)
    user = "uid"
    item = "item_id"
    timestamp = "timestamp"           # integer seconds
    type = "event_type"
    played_ratio = "played_ratio_pct" # percent played, listens only
    organic = "is_organic"            # 0/1, or "" for none
    [events.types]                    # meaning = the value written in `type`
    listen = "listen"
    like = "like"

    [items.artist]                    # item -> artist and item -> album maps (optional)
    file = "artist_item_mapping.parquet"
    value = "artist_id"

    [label]
    played_ratio_min = 50

    [history]
    length = 192                      # events kept per anchor, most recent
    strategy = "interleaved"          # or last_n
    scan = 20000                      # events looked back
    min_history = 64

    [[crosses]]                       # hashed features of the anchor (xxh64, seed 0, mod size)
    name = "user_x_artist"
    keys = ["uid", "artist"]
    size = 100003

    [split]
    window_seconds = 86400
    holdout_windows = 1

This module holds the values and their rules, and the one reader of their keys.
"""

from __future__ import annotations

import tomllib
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from shardrec.dataloader.spec.feature_spec import MAX_HASH_SIZE, SpecError
from shardrec.dataloader.spec.text_format import PARQUET_MISSING, check_missing_words
from shardrec.dataloader.spec.toml_text import toml_value
from shardrec.dataloader.util.near import did_you_mean

EVENT_FORMATS = ("parquet", "csv", "tsv")
MEANINGS = ("listen", "like", "dislike", "unlike", "undislike")
"""What an event type means; listens are the anchors, likes join the history."""
STRATEGIES = ("interleaved", "last_n")
CROSS_KEYS = ("uid", "item", "artist", "album", "hour", "organic")
"""What a cross hashes, all of the anchor: its user, item, the item's artist and album, the hour of
day of its time, whether it was organic."""
MAP_NAMES = ("artist", "album")
MAX_CROSS_KEYS = 3


@dataclass(frozen=True)
class EventColumns:
    """Column names of the event log."""

    user: str = "uid"
    item: str = "item_id"
    timestamp: str = "timestamp"
    type: str = "event_type"
    played_ratio: str = "played_ratio_pct"
    organic: str = "is_organic"
    """Empty: the log has no such column (crosses cannot use `organic`)."""
    types: dict[str, str] = field(default_factory=lambda: {m: m for m in MEANINGS})
    """Meaning -> the value written in the type column (compared as text)."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.types) - set(MEANINGS))
        if unknown:
            raise ValueError(
                f"types: {unknown[0]!r} is not one of {', '.join(MEANINGS)}{did_you_mean(unknown[0], MEANINGS)}"
            )
        if "listen" not in self.types:
            raise ValueError("types: needs listen (the listens are the samples)")
        written = list(self.types.values())
        if len(set(written)) != len(written):
            raise ValueError(f"types: two meanings share one written value ({written})")


@dataclass(frozen=True)
class ItemMap:
    """A file of two columns: item -> its artist (or album)."""

    file: str
    """Relative to the spec file's folder, or absolute; Parquet, or CSV/TSV with a header."""
    value: str
    """The column of the artist (album) id."""
    item: str = "item_id"


@dataclass(frozen=True)
class HistorySpec:
    """How an anchor's history is gathered (at load time, from its user's earlier events)."""

    length: int = 192
    """Events kept, the most recent ones (interleaved: length / 3 of each of listen-plus, like,
    skip)."""
    strategy: str = "interleaved"
    scan: int = 20000
    """Events looked back from the anchor (at most)."""
    min_history: int = 64
    """Earlier events (of any type) a listen needs to be a sample."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(
                f"strategy = {self.strategy!r} is not one of {', '.join(STRATEGIES)}"
                f"{did_you_mean(self.strategy, STRATEGIES)}"
            )
        least = 3 if self.strategy == "interleaved" else 1
        if self.length < least:
            each = " (length / 3 of each of listen-plus, like and skip)" if least == 3 else ""
            raise ValueError(f"length = {self.length} keeps nothing{each}: give at least {least}")
        if self.scan < 1 or self.min_history < 0:
            raise ValueError(
                f"scan = {self.scan} must be >= 1 and min_history = {self.min_history} >= 0"
            )

    @property
    def per_pool(self) -> int:
        """Events kept of each pool (interleaved)."""
        return self.length // 3


@dataclass(frozen=True)
class CrossSpec:
    """A hashed feature of the anchor: xxh64 (seed 0) of its keys as little-endian int64, mod
    size."""

    name: str
    keys: list[str]
    size: int

    def __post_init__(self) -> None:
        bad = [k for k in self.keys if k not in CROSS_KEYS]
        if bad:
            raise ValueError(
                f"keys: {bad[0]!r} is not one of {', '.join(CROSS_KEYS)}{did_you_mean(bad[0], CROSS_KEYS)}"
            )
        if not 1 <= len(self.keys) <= MAX_CROSS_KEYS:
            raise ValueError(f"keys: {len(self.keys)} keys, expected 1 to {MAX_CROSS_KEYS}")
        if self.size < 2:
            raise ValueError(f"size = {self.size} must be at least 2")
        if self.size > MAX_HASH_SIZE:  # as a column's hash_size: its rows are numbered by int64
            raise ValueError(
                f"size = {self.size} is over {MAX_HASH_SIZE} (2^63 - 1), the most table rows "
                "64-bit ids can number: give a smaller one"
            )


@dataclass(frozen=True)
class WindowSpec:
    """Wall-clock windows of the samples, and which are held out."""

    window_seconds: int = 86400
    holdout_windows: int = 1
    """The last windows, whose samples are the val split (the reference's one held-out day)."""
    test_seconds: int = 0
    """The log's last seconds (after `gap_seconds`) as the test split; 0: no test split."""
    gap_seconds: int = 1800

    def __post_init__(self) -> None:
        if self.window_seconds < 1 or self.holdout_windows < 0:
            raise ValueError(
                f"window_seconds = {self.window_seconds} must be >= 1 and holdout_windows "
                f"= {self.holdout_windows} >= 0"
            )
        if self.test_seconds < 0 or self.gap_seconds < 0:
            raise ValueError("test_seconds and gap_seconds must be >= 0")


@dataclass(frozen=True)
class EventSpec:
    """An event log's columns, maps, label, history, crosses and windows."""

    format: str = "parquet"
    events: EventColumns = field(default_factory=EventColumns)
    items: dict[str, ItemMap] = field(default_factory=dict)
    """artist and/or album maps."""
    played_ratio_min: float = 50.0
    """A listen played at least this percent is a listen-plus (label 1)."""
    history: HistorySpec = field(default_factory=HistorySpec)
    crosses: tuple[CrossSpec, ...] = ()
    split: WindowSpec = field(default_factory=WindowSpec)
    missing: tuple[str, ...] = ()
    """Words a text log writes for a missing value, such as ["NA", "\\N"]: each field that is one
    reads as an empty field does (a played ratio that only a listen needs; a user, item, time or
    type refused, as an empty one is). Not the item maps'."""

    def __post_init__(self) -> None:
        if self.format not in EVENT_FORMATS:
            raise ValueError(
                f"format kind = {self.format!r} is not one of {', '.join(EVENT_FORMATS)}"
            )
        object.__setattr__(self, "missing", tuple(self.missing))
        if self.format == "parquet" and self.missing:
            raise ValueError(f"[format] {PARQUET_MISSING}")
        try:
            check_missing_words(self.missing, "\t" if self.format == "tsv" else ",")
        except ValueError as e:
            raise ValueError(f"[format] {e}") from None
        taken = [m for m, written in self.events.types.items() if written in self.missing]
        if taken:  # its events would read as typeless and be refused as such, the key unnamed
            raise ValueError(
                f"[format] missing word {self.events.types[taken[0]]!r} is the value written for "
                f"[events.types] {taken[0]}: its events would have no type; take it out of one "
                "of them"
            )
        unknown = sorted(set(self.items) - set(MAP_NAMES))
        if unknown:
            raise ValueError(f"items.{unknown[0]}: maps are {', '.join(MAP_NAMES)}")
        names = [c.name for c in self.crosses]
        if len(set(names)) != len(names):
            raise ValueError(f"crosses: names must be unique ({', '.join(names)})")
        for cross in self.crosses:
            missing = [k for k in cross.keys if k in MAP_NAMES and k not in self.items]
            if missing:
                raise ValueError(f"crosses ({cross.name}): {missing[0]} needs [items.{missing[0]}]")
            if "organic" in cross.keys and not self.events.organic:
                raise ValueError(f"crosses ({cross.name}): organic needs events.organic")

    def sample_settings(self) -> dict[str, Any]:
        """What decides the samples a log makes (their labels, histories, crosses and splits),
        named as the spec file names them: a model scores only samples made as its own were. The
        column names are not here: another log may call its columns otherwise."""
        out: dict[str, Any] = {"[label] played_ratio_min": self.played_ratio_min}
        out |= {f"[history] {k}": v for k, v in asdict(self.history).items()}
        out["[[crosses]]"] = [asdict(c) for c in self.crosses]
        out |= {f"[split] {k}": v for k, v in asdict(self.split).items()}
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain data (the manifest keeps it); `missing` only where given, so a spec without it
        keeps the plain data it had before the key."""
        out = asdict(self)
        out["crosses"] = [asdict(c) for c in self.crosses]
        missing = out.pop("missing")
        return out | ({"missing": list(missing)} if missing else {})


def _build(cls: type, raw: Any, where: str) -> Any:
    """cls(**raw), every key known and of its type; SpecError names `where` and the key."""
    if not isinstance(raw, dict):
        raise SpecError(f"{where}: should be a table")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in fields(cls)]
    for key, value in raw.items():
        if key not in known:
            hint = did_you_mean(key, known) or f" (known: {', '.join(known)})"
            raise SpecError(f"{where}: unknown key {key!r}{hint}")
        hint = hints[key]
        origin = typing.get_origin(hint) or hint
        ok = isinstance(value, origin) and not (origin in (int, float) and isinstance(value, bool))
        if origin is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise SpecError(f"{where}: {key} = {value!r} should be {origin.__name__}")
    try:
        return cls(**raw)
    except (TypeError, ValueError) as e:
        raise SpecError(f"{where}: {e}") from None


FORMAT_KEYS = ("kind", "missing")
SECTIONS = ("format", "events", "items", "label", "history", "crosses", "split")


def event_spec_from_dict(raw: Any, source: str) -> EventSpec:
    """An EventSpec from plain data: parsed TOML (its sections), or a manifest's copy
    (EventSpec.to_dict's shape)."""
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: an event spec is a table of sections")
    if "events" in raw and isinstance(raw.get("history"), dict) and "played_ratio_min" in raw:
        raw = _from_plain(raw)  # the manifest's copy
    for key in raw:
        if key not in SECTIONS:
            raise SpecError(f"{source}: unknown section [{key}]{did_you_mean(key, SECTIONS)}")
    fmt = raw.get("format", {})
    holds = (
        f"kind ({', '.join(EVENT_FORMATS)}) and missing (a text log's words for a missing value, "
        'such as ["NA"])'
    )
    if not isinstance(fmt, dict):
        raise SpecError(f"{source}: [format] should be a table of {holds}")
    unknown = sorted(set(fmt) - set(FORMAT_KEYS))
    if unknown:
        raise SpecError(
            f"{source}: [format] unknown key {unknown[0]!r}"
            f"{did_you_mean(unknown[0], FORMAT_KEYS)} ([format] holds {holds})"
        )
    missing = fmt.get("missing", [])
    if not isinstance(missing, list) or not all(isinstance(w, str) for w in missing):
        raise SpecError(
            f'{source}: [format] missing = {missing!r} should be a list of strings, such as ["NA"]'
        )
    events = dict(raw.get("events", {}))
    types = events.get("types")
    for meaning, value in types.items() if isinstance(types, dict) else ():
        if not isinstance(value, str):
            raise SpecError(
                f"{source}: [events.types] {meaning} = {value!r} should be a string, the value "
                f'written in the type column as text (e.g. {meaning} = "{value}")'
            )
    items = raw.get("items", {})
    if not isinstance(items, dict):
        raise SpecError(f"{source}: [items] should hold [items.artist] and/or [items.album]")
    label = raw.get("label", {})
    if not isinstance(label, dict) or set(label) - {"played_ratio_min"}:
        raise SpecError(f"{source}: [label] holds one key, played_ratio_min")
    ratio = label.get("played_ratio_min", 50.0)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 100:
        raise SpecError(
            f"{source}: [label] played_ratio_min = {ratio!r} should be a number from 0 to 100 "
            "(the percent a listen is played to be a listen-plus)"
        )
    crosses = raw.get("crosses", [])
    if not isinstance(crosses, list):
        raise SpecError(f"{source}: crosses should be [[crosses]] tables")
    try:
        return EventSpec(
            format=fmt.get("kind", "parquet"),
            events=_build(EventColumns, events, f"{source}: [events]"),
            items={k: _build(ItemMap, v, f"{source}: [items.{k}]") for k, v in items.items()},
            played_ratio_min=float(ratio),
            history=_build(HistorySpec, raw.get("history", {}), f"{source}: [history]"),
            crosses=tuple(
                _build(CrossSpec, c, f"{source}: crosses[{i}]") for i, c in enumerate(crosses)
            ),
            split=_build(WindowSpec, raw.get("split", {}), f"{source}: [split]"),
            missing=tuple(missing),
        )
    except ValueError as e:
        if isinstance(e, SpecError):
            raise
        raise SpecError(f"{source}: {e}") from None


def _from_plain(plain: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": {
            "kind": plain["format"],
            **({"missing": plain["missing"]} if "missing" in plain else {}),
        },
        "events": plain["events"],
        "items": plain["items"],
        "label": {"played_ratio_min": plain["played_ratio_min"]},
        "history": plain["history"],
        "crosses": plain["crosses"],
        "split": plain["split"],
    }


def event_spec_to_toml(spec: EventSpec, preamble: str = "") -> str:
    """The spec as a TOML file that load_event_spec reads back equal, every key written.

    preamble: comment lines first."""
    plain = _from_plain(spec.to_dict())
    types = plain["events"].pop("types")
    tables = [("format", plain["format"]), ("events", plain["events"]), ("events.types", types)]
    tables += [(f"items.{name}", item) for name, item in plain["items"].items()]
    tables += [(key, plain[key]) for key in ("label", "history")]
    tables += [("[crosses]", cross) for cross in plain["crosses"]] + [("split", plain["split"])]
    blocks = [
        "\n".join([f"[{name}]", *(f"{key} = {toml_value(value)}" for key, value in values.items())])
        for name, values in tables
    ]
    if preamble:
        blocks.insert(0, "\n".join(f"# {line}" if line else "#" for line in preamble.splitlines()))
    return "\n\n".join(blocks) + "\n"


def load_event_spec(path: str | Path) -> EventSpec:
    """Read an event spec file; SpecError names the file and the key to blame."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as e:
        raise SpecError(f"{path}: cannot read the event spec ({e.strerror or e})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SpecError(f"{path}: not a TOML event spec ({e})") from None
    return event_spec_from_dict(raw, str(path))
