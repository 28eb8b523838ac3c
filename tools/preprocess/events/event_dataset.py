"""An event log -> an event-log dataset: anchors, windows, splits, parts, statistics, manifest.

Anchors are the listens with at least `min_history` earlier events of their user. Their times
cut them into windows of `window_seconds` from the earliest; the last `holdout_windows` windows
are the val split (the reference trains on days 0..298 and evaluates day 299), the others train;
with `test_seconds`, anchors in the log's last seconds (after a gap) are test, and the windows are
counted over the earlier ones. Each split's timeline lists its anchors by (window, part, user,
event): the reference's user-major order within a day.

Users go into parts of about EVENTS_PER_PART events (a user never straddles two parts). The
planner's statistics (ids a sample looks up per table) come from gathering the history of a
sample of anchors, as the loader will.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.dataloader.events import event_files
from shardrec.dataloader.events.event_files import EVENTS_KIND, EventsInfo
from shardrec.dataloader.events.history_kernels import LISTEN_PLUS, gather_histories
from shardrec.dataloader.format.manifest import (
    MANIFEST,
    DatasetError,
    Manifest,
    SparseFeature,
    SplitInfo,
    read_raw,
    smallest_uint,
)
from shardrec.dataloader.spec.event_spec import EventSpec
from shardrec.dataloader.util import locks
from shardrec.tools.preprocess.events.event_columns import EventLogError
from shardrec.tools.preprocess.events.event_log import EventLog, read_event_log

logger = logging.getLogger(__name__)

EVENTS_PER_PART = 1 << 22
STATISTICS_SAMPLE = 20_000
"""Anchors whose history is gathered for the planner's statistics."""
DENSE_FEATURES = ["log_history", "hour_sin", "hour_cos"]
"""What the loader gives a sample besides ids: log(1 + events before it), its hour of day."""
ACTION_VALUES = 8
"""Action bits of an event: listen-plus 1, like 2, skip 4."""


def sparse_features(spec: EventSpec, log: EventLog, stats: dict[str, dict]) -> list[SparseFeature]:
    """The features the loader gives each sample, in KeyedJaggedTensor order: the user and the
    crosses (one id each), the history (a sequence of items, its sides: artists, albums, times,
    actions) and the candidate (the anchor's item, artist, album: on the history's tables)."""
    items = len(log.artist)
    out = [SparseFeature("uid", int(log.user.max()) + 1, "uint32")]
    out += [SparseFeature(c.name, c.size, str(smallest_uint(c.size - 1))) for c in spec.crosses]
    sides = [n for n in ("artist", "album") if n in spec.items]
    rows = {"item": items, **{n: int(getattr(log, n).max()) + 1 for n in sides}}

    def hist(name: str, **kw: Any) -> SparseFeature:
        return SparseFeature(
            f"hist_{name}", multi_hot=True, sequence=True, stats=stats.get(f"hist_{name}", {}), **kw
        )

    out.append(hist("item", cardinality=items, dtype="uint32", table="item", pooling="mean"))
    for n in sides:
        out.append(
            hist(
                n, cardinality=rows[n], dtype="uint32", table=n, pooling="mean", side_of="hist_item"
            )
        )
    out.append(
        hist(
            "ts",
            cardinality=int(log.ts.max()) + 1,
            dtype="uint64",
            side_of="hist_item",
            values="timestamps",
        )
    )
    out.append(
        hist(
            "action",
            cardinality=ACTION_VALUES,
            dtype="uint8",
            side_of="hist_item",
            values="integers",
        )
    )
    out += [SparseFeature(f"cand_{n}", rows[n], "uint32", table=n) for n in ("item", *sides)]
    return out


def _anchors(log: EventLog, spec: EventSpec) -> tuple[np.ndarray, np.ndarray]:
    """(user row, event place) of every anchor, in (user, event) order."""
    lengths = np.diff(log.offsets)
    user_of = np.repeat(np.arange(len(lengths)), lengths)
    place = np.arange(log.rows) - log.offsets[user_of]
    chosen = np.flatnonzero(log.listen & (place >= spec.history.min_history))
    return user_of[chosen], place[chosen]


def _history_lengths(log: EventLog, spec: EventSpec, users, places, rng) -> np.ndarray:
    """Kept history length of a sample of anchors (the loader's kernel)."""
    pick = rng.choice(len(users), min(len(users), STATISTICS_SAMPLE), replace=False)
    pick.sort()
    first = log.offsets[users[pick]]
    h = spec.history
    last_n = h.length if h.strategy == "last_n" else 0
    width = h.length if last_n else 3 * h.per_pool
    pos = np.empty((len(pick), max(width, 1)), np.int64)
    lengths = np.empty(len(pick), np.int64)
    gather_histories(
        first + places[pick], first, log.action, h.scan, h.per_pool, last_n, pos, lengths
    )
    return lengths


def _splits(
    log: EventLog, spec: EventSpec, spec_path: Path, users: np.ndarray, places: np.ndarray
) -> tuple[dict[str, np.ndarray], dict[str, list[int]], dict[str, list[int]], int]:
    """Per split, the anchors (indexes into users/places) in timeline order, its windows' offsets
    and numbers; and t_min."""
    ts = log.ts[log.offsets[users] + places]
    w = spec.split
    chosen: dict[str, np.ndarray] = {}
    if w.test_seconds:
        test_start = int(log.ts.max()) - w.test_seconds + 1
        chosen["test"] = np.flatnonzero(ts >= test_start)
        early = np.flatnonzero(ts < test_start - w.gap_seconds)
    else:
        early = np.arange(len(ts))
    if len(early) == 0:
        raise EventLogError(
            f"no listen has {spec.history.min_history} earlier events before the test window: "
            "lower [history] min_history or test_seconds"
        )
    t_min = int(ts[early].min())
    window = (ts - t_min) // w.window_seconds
    last = int(window[early].max())
    if w.holdout_windows > last:
        before = " before the test window" if w.test_seconds else ""
        raise EventLogError(
            f"{spec_path}: [split] holdout_windows = {w.holdout_windows} holds out all of the "
            f"log's {last + 1} window(s) of window_seconds = {w.window_seconds}{before}, leaving "
            f"none to train on; hold out at most {last}"
            + ("" if last else " (a shorter window_seconds makes more windows)")
        )
    holdout = max(0, last + 1 - w.holdout_windows)
    chosen["train"] = early[window[early] < holdout]
    if w.holdout_windows:
        chosen["val"] = early[window[early] >= holdout]
    timelines, offsets, ids = {}, {}, {}
    for split, anchors in chosen.items():
        order = anchors[np.argsort(window[anchors], kind="stable")]
        wins = window[order]
        numbers, starts = np.unique(wins, return_index=True)
        timelines[split] = order
        offsets[split] = [*map(int, starts), len(order)]
        ids[split] = [int(n) for n in numbers]
    return timelines, offsets, ids, t_min


def _part_of_users(log: EventLog) -> np.ndarray:
    """The part of each user: consecutive users, about EVENTS_PER_PART events a part, numbered
    from 0 without a gap (a user of more than twice EVENTS_PER_PART events would otherwise skip a
    number, leaving a part with no user)."""
    block = log.offsets[:-1] // EVENTS_PER_PART
    return np.unique(block, return_inverse=True)[1].astype(np.int64)


def build_event_dataset(
    paths: list[Path], spec: EventSpec, spec_path: Path, out: Path, seed: int = 0
) -> Manifest:
    """Read the log, write the dataset into `out`, the manifest last; returns it."""
    out.mkdir(parents=True, exist_ok=True)
    lock = locks.dataset_lock(out)  # one writer at a time; the kernel frees it if this one dies
    try:
        check_out(out, spec, paths, spec_path)
        return _build(paths, spec, spec_path, out, seed)
    finally:
        os.close(lock)


def check_out(out: Path, spec: EventSpec, paths: list[Path], spec_path: Path) -> None:
    """EventLogError unless `out` is new, or holds what this command makes: the dataset of the
    same inputs and the same event spec (a rerun rewrites it), or an event-log dataset cut short
    before its manifest. Another dataset there would be replaced without a word."""
    remedy = "remove the directory or choose another --out"
    if (out / locks.WORK_DIR / "run.json").is_file():
        raise EventLogError(f"{out}: holds a run of click-log preprocessing; {remedy}")
    if not (out / MANIFEST).is_file():
        return
    try:
        raw, _ = read_raw(out)
    except DatasetError as e:
        raise EventLogError(f"{e}; {remedy}") from None
    if raw.get("kind") != EVENTS_KIND:
        raise EventLogError(f"{out}: holds a dataset of click logs (not an event log's); {remedy}")
    # A spec without `missing` leaves it out of its plain data: shown as none given, not null.
    old = {"format.missing": [], **dict(_flat(raw.get("events", {}).get("spec", {})))}
    new = {"format.missing": [], **dict(_flat(json.loads(json.dumps(spec.to_dict()))))}
    differs = [k for k in dict.fromkeys([*old, *new]) if old.get(k) != new.get(k)]
    if differs:
        k = differs[0]
        raise EventLogError(
            f"{out}: holds a dataset made with another event spec ({k} = "
            f"{json.dumps(old.get(k))} there, {json.dumps(new.get(k))} in {spec_path}); {remedy}"
        )
    inputs = [str(p) for p in paths]
    if raw.get("options", {}).get("inputs") != inputs:
        there = ", ".join(map(str, raw.get("options", {}).get("inputs") or [])) or "none"
        raise EventLogError(
            f"{out}: holds a dataset of other inputs ({there}, not {', '.join(inputs)}); {remedy}"
        )


def _flat(spec: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(key, value) of an event spec's plain data, named as its file names them
    (label.played_ratio_min, history.length, crosses)."""
    for key, value in spec.items():
        name = {
            "played_ratio_min": "label.played_ratio_min",
            "format": "format.kind",
            "missing": "format.missing",
        }.get(key, key)
        if isinstance(value, dict) and value:
            yield from _flat(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def _build(paths: list[Path], spec: EventSpec, spec_path: Path, out: Path, seed: int) -> Manifest:
    log = read_event_log(paths, spec, spec_path)
    users, places = _anchors(log, spec)
    if len(users) == 0:
        raise EventLogError(
            f"{paths[0]}: no listen has {spec.history.min_history} earlier events of its user: "
            "lower [history] min_history"
        )
    timelines, windows, window_ids, t_min = _splits(log, spec, spec_path, users, places)
    # A rerun rewrites the files: until its own manifest, none may say they are a dataset.
    (out / MANIFEST).unlink(missing_ok=True)
    part_of = _part_of_users(log)
    parts = []
    for p in range(int(part_of.max()) + 1):
        mine = np.flatnonzero(part_of == p)
        lo, hi = log.offsets[mine[0]], log.offsets[mine[-1] + 1]
        events = {
            "item": log.item[lo:hi],
            "ts": log.ts[lo:hi],
            "action": log.action[lo:hi],
            "organic": log.organic[lo:hi],
        }
        parts.append(
            event_files.write_part(
                out, p, log.user[mine], log.offsets[mine[0] : mine[-1] + 2] - lo, events
            )
        )
    first_user = np.array([np.flatnonzero(part_of == p)[0] for p in range(len(parts))])
    items = event_files.write_items(out, log.artist, log.album)
    files = {}
    for split, order in timelines.items():
        u = users[order]
        files[split] = event_files.write_timeline(
            out, split, part_of[u], u - first_user[part_of[u]], places[order]
        )
    lengths = _history_lengths(log, spec, users, places, np.random.default_rng(seed))
    hist_stats = {
        "mean_ids_per_sample": round(float(lengths.mean()), 4),
        "p95_ids_per_sample": float(np.percentile(lengths, 95)),
    }
    stats = {f"hist_{n}": hist_stats for n in ("item", "artist", "album", "ts", "action")}
    labels = {
        split: float(np.mean(log.action[log.offsets[users[o]] + places[o]] == LISTEN_PLUS))
        for split, o in timelines.items()
    }
    info = EventsInfo(
        parts=parts,
        items=items,
        timelines=files,
        windows=windows,
        window_ids=window_ids,
        t_min=t_min,
        users=len(log.user),
        events=log.rows,
        spec=spec.to_dict(),
        statistics={
            "anchors": {s: len(o) for s, o in timelines.items()},
            "positive_rate": {s: round(r, 4) for s, r in labels.items()},
            "history_length": hist_stats,
        },
    )
    manifest = Manifest(
        dense_features=list(DENSE_FEATURES),
        sparse_features=sparse_features(spec, log, stats),
        splits={s: SplitInfo(rows=len(o), parts=[]) for s, o in timelines.items()},
        options={"events_spec": str(spec_path), "inputs": [str(p) for p in paths]},
        kind=EVENTS_KIND,
        events=info.to_dict(),
    )
    manifest.save(out)
    logger.info(
        "%s: %d users, %d events, %s anchors",
        out,
        len(log.user),
        log.rows,
        {s: len(o) for s, o in timelines.items()},
    )
    return manifest


def windows_per_split(manifest: Manifest) -> dict[str, int]:
    """Windows of each split (for the command's summary)."""
    info = EventsInfo.from_dict(manifest.events)
    return {s: len(w) - 1 for s, w in info.windows.items()}


def describe(manifest: Manifest) -> dict[str, Any]:
    """What `shardrec preprocess --events` prints: users, events, anchors and windows per split."""
    info = EventsInfo.from_dict(manifest.events)
    return {
        "users": info.users,
        "events": info.events,
        "parts": len(info.parts),
        "splits": {
            s: {"anchors": manifest.splits[s].rows, "windows": len(info.windows[s]) - 1}
            for s in manifest.splits
        },
        "positive_rate": info.statistics.get("positive_rate", {}),
        "history_length_mean": info.statistics.get("history_length", {}).get(
            "mean_ids_per_sample", math.nan
        ),
    }
