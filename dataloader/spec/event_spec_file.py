"""Event spec files: an event spec read from TOML (or a manifest's copy of it), every key checked
and named where it is wrong, and written back as TOML (event_spec.py holds the values).
"""

from __future__ import annotations

import tomllib
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any

from shardrec.dataloader.spec.event_spec import (
    EVENT_FORMATS,
    CrossSpec,
    EventColumns,
    EventSpec,
    HistorySpec,
    ItemMap,
    WindowSpec,
)
from shardrec.dataloader.spec.feature_spec import SpecError
from shardrec.dataloader.spec.toml_text import toml_value
from shardrec.dataloader.util.near import did_you_mean


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
