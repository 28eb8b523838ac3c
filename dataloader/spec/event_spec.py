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

This module holds the values and their rules; event_spec_file.py is the one reader of their keys.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from shardrec.dataloader.spec.feature_spec import MAX_HASH_SIZE
from shardrec.dataloader.spec.text_format import PARQUET_MISSING, check_missing_words
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
