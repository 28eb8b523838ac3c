"""Reading the planner's JSON files strictly: plan files (plan_file.py) and calibration profiles
(topology.py).

Python's json module reads `NaN`, `Infinity` and `-Infinity` as floats, and a `true` passes an
`isinstance(value, int)` check, so a hand-edited profile could plan with `max_step_ms: nan` and
a plan file whose fields have the wrong type failed only inside the ranks. Here every value is
checked by type as it is read, and each error is one line naming the file and the key (the
value cut to 80 characters, dataloader.format.shown).
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path
from typing import Any

from shardrec.dataloader.format.manifest import shown

_KINDS: dict[str, tuple[Any, str]] = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "count": (
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "an integer >= 0",
    ),
    "number": (
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
        "a number",
    ),
    "str": (lambda v: isinstance(v, str), "a string"),
    "object": (lambda v: isinstance(v, dict), "an object"),
    "list": (lambda v: isinstance(v, list), "a list"),
}


class _NonFinite(str):
    """What JSON's non-standard NaN / Infinity become while parsing, so that the key holding one
    can be named (json's parse_constant gets the word, not where it stands)."""


def _non_finite(value: Any, where: str) -> tuple[str, str] | None:
    """The first (key path, word) of a NaN or Infinity in parsed JSON, or None."""
    if isinstance(value, _NonFinite):
        return where or "the document", str(value)
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        found = _non_finite(
            item,
            f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else str(key),
        )
        if found:
            return found
    return None


def read_strict_json(path: str | Path, what: str) -> Any:
    """Parse a JSON file, refusing NaN and Infinity; ValueError naming the file (and the key)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"{path}: cannot read {what}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a JSON {what}: not UTF-8 text (byte {e.start})") from None
    try:
        raw = json.loads(text, parse_constant=_NonFinite)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a JSON {what}: {e}") from None
    found = _non_finite(raw, "")
    if found:
        raise ValueError(f"{path}: {found[0]} is {found[1]}, not a finite number")
    return raw


def expect(path: Path, value: Any, kind: str, where: str) -> Any:
    """`value` if it is of `kind` (one of _KINDS), else ValueError naming the file and key."""
    ok, described = _KINDS[kind]
    if not ok(value):
        raise ValueError(f"{path}: {where} is {shown(value)}, expected {described}")
    return value


def need(path: Path, obj: dict, key: str, kind: str, where: str = "", required: bool = True) -> Any:
    """obj[key], checked to be of `kind`; ValueError if it is missing (when required)."""
    if key not in obj:
        if required:
            raise ValueError(f"{path}: {where}{key} is missing")
        return None
    return expect(path, obj[key], kind, f"{where}{key}")


def _kind_of(hint: Any) -> tuple[str, bool]:
    """(_KINDS key, optional) of a dataclass field's type: int, float, str, dict[...], list[...], X
    | None."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return _kind_of(args[0])[0], True
    origin = typing.get_origin(hint) or hint
    if dataclasses.is_dataclass(origin):  # a nested dataclass is an object in the file
        return "object", False
    return {int: "count", float: "number", str: "str", dict: "object", list: "list"}[origin], False


def check_fields(path: Path, raw: dict, cls: type, where: str) -> None:
    """Every field of the dataclass `cls` in `raw`, by its type (ints are counts: >= 0); ValueError
    naming the file and `where`.key of the first missing or wrong one."""
    # A field with a default may be absent: files written before it existed, or written without it.
    defaulted = {
        f.name
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    for name, hint in typing.get_type_hints(cls).items():
        kind, optional = _kind_of(hint)
        need(path, raw, name, kind, where, required=not optional and name not in defaulted)


def check_plan_fields(path: Path, raw: dict) -> None:
    """Every field of a plan file by type, so a bad one is named here, not inside the ranks."""
    fingerprint = need(path, raw, "fingerprint", "object")
    for key, kind in (
        ("world_size", "int"),
        ("global_batch_size", "int"),
        ("device_kind", "str"),
        ("digest", "str"),
    ):
        need(path, fingerprint, key, kind, "fingerprint.")
    for i, table in enumerate(need(path, fingerprint, "tables", "list", "fingerprint.")):
        where = f"fingerprint.tables[{i}]"
        expect(path, table, "object", where)
        for key, kind in (("name", "str"), ("rows", "count"), ("dim", "count"), ("pooling", "str")):
            need(path, table, key, kind, where + ".")
        for j, feature in enumerate(need(path, table, "features", "list", where + ".")):
            expect(path, feature, "str", f"{where}.features[{j}]")
    for key, kind in (
        ("planner", "str"),
        ("topology", "object"),
        ("estimate", "object"),
        ("sharding_group_size", "count"),
    ):
        need(path, raw, key, kind, required=False)
    for i, table in enumerate(need(path, raw, "tables", "list")):
        where = f"tables[{i}]"
        expect(path, table, "object", where)
        for key in ("name", "sharding_type", "compute_kernel"):
            need(path, table, key, "str", where + ".")
        for j, shard in enumerate(need(path, table, "shards", "list", where + ".")):
            expect(path, shard, "object", f"{where}.shards[{j}]")
            for key in ("rank", "row_offset", "col_offset", "rows", "cols"):
                need(path, shard, key, "count", f"{where}.shards[{j}].")
        cache = need(path, table, "cache", "object", where + ".", required=False)
        if cache is not None:
            need(path, cache, "load_factor", "number", f"{where}.cache.")
            need(path, cache, "algorithm", "str", f"{where}.cache.", required=False)
            for key, kind in (("rows", "count"), ("hit_rates", "number")):
                for k, value in enumerate(need(path, cache, key, "list", f"{where}.cache.")):
                    expect(path, value, kind, f"{where}.cache.{key}[{k}]")
