"""Feature specs in and out of TOML (and the manifest's plain data): the one reader of spec keys.

A spec file is a `[format]` table and one `[[columns]]` entry per field of a row, each with a
`name` and a `role` and that role's keys (spec.py documents each key; so does the README). Every
error names the spec file and the key, with the nearest known word where one was misspelt:

    spec.toml: columns[3] (genres): unknown key 'seperator'; did you mean separator?
"""

from __future__ import annotations

import tomllib
import types
import typing
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from shardrec.dataloader.format.manifest import MANIFEST, Manifest
from shardrec.dataloader.spec.feature_spec import (
    CATEGORICAL_KINDS,
    COLUMN_TYPES,
    DENSE_TRANSFORMS,
    DENSE_TYPES,
    POOLINGS,
    ROLES,
    SEQUENCE_VALUES,
    FeatureSpec,
    SpecError,
    criteo_spec,
)
from shardrec.dataloader.spec.text_format import FORMAT_KINDS, TextFormat
from shardrec.dataloader.spec.toml_text import toml_value
from shardrec.dataloader.util.near import did_you_mean

# Keys whose value is one word of a fixed set: a misspelt one gets the nearest word.
_CHOICES = {
    "kind": CATEGORICAL_KINDS,
    "type": DENSE_TYPES,
    "transform": DENSE_TRANSFORMS,
    "pooling": POOLINGS,
    "values": SEQUENCE_VALUES,
}


def _near(word: str, known, listed: bool = False) -> str:
    """`; did you mean X?` for the close one (near.did_you_mean), else the known words (none where
    `listed`: the message names them already)."""
    return did_you_mean(word, known) or ("" if listed else f" (known: {', '.join(known)})")


def _words(hint: Any) -> str:
    args = [a for a in typing.get_args(hint) if a is not type(None)] if _is_union(hint) else [hint]
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    if typing.get_origin(hint) is tuple:
        return 'a list of strings, such as ["NA"]'
    return " or ".join(names.get(a, "a table of value = 0 or 1") for a in args)


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _fits(value: Any, hint: Any) -> bool:
    if _is_union(hint):
        return any(_fits(value, a) for a in typing.get_args(hint) if a is not type(None))
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if typing.get_origin(hint) is dict:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    if typing.get_origin(hint) is tuple:  # a TOML array of strings
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, hint)


def _build(cls: type, raw: dict[str, Any], where: str, skip: tuple[str, ...] = ()) -> Any:
    """cls(**raw) with every key known, of the right type, and chosen from its set of words."""
    hints = typing.get_type_hints(cls)
    known = [f.name for f in fields(cls)]
    for key, value in raw.items():
        if key in skip:
            continue
        if key not in known:
            raise SpecError(f"{where}: unknown key {key!r}{_near(key, known)}")
        if not _fits(value, hints[key]):
            raise SpecError(f"{where}: {key} = {value!r} should be {_words(hints[key])}")
        choices = FORMAT_KINDS if (cls is TextFormat and key == "kind") else _CHOICES.get(key)
        if choices and value not in choices:
            raise SpecError(
                f"{where}: {key} = {value!r} is not one of {', '.join(choices)}"
                f"{_near(value, choices, listed=True)}"
            )
    floats = [
        k
        for k in raw
        if k not in skip and hints[k] in (float, float | None) and isinstance(raw[k], int)
    ]
    raw = {
        **raw,
        **{k: float(raw[k]) for k in floats},
    }  # `threshold = 4` and 4.0 are one spec (one hash)
    if "position" in raw and raw["position"] < 0:
        raise SpecError(
            f"{where}: position = {raw['position']} must be 0 or more (0 is the first field)"
        )
    try:
        return cls(**{k: v for k, v in raw.items() if k not in skip})
    except (ValueError, TypeError) as e:
        raise SpecError(f"{where}: {e}") from None


def spec_from_dict(raw: Any, source: str) -> FeatureSpec:
    """A FeatureSpec from plain data (parsed TOML, or a manifest's `options.spec`).

    source: what the data came from (a file name), the start of every error message.
    """
    if not isinstance(raw, dict):
        raise SpecError(f"{source}: a spec is a table with [format] and [[columns]]")
    for key in raw:
        if key not in ("format", "columns"):
            raise SpecError(f"{source}: unknown section {key!r}{_near(key, ['format', 'columns'])}")
    fmt = raw.get("format", {})
    if not isinstance(fmt, dict):
        raise SpecError(f"{source}: format should be a table ([format])")
    text = _build(TextFormat, fmt, f"{source}: format")
    entries = raw.get("columns")
    if (
        not isinstance(entries, list)
        or not entries
        or not all(isinstance(c, dict) for c in entries)
    ):
        raise SpecError(
            f"{source}: no columns: add one [[columns]] table per field, each with a name and a role"
        )
    columns = []
    for i, entry in enumerate(entries):
        name = entry.get("name")
        where = f"{source}: columns[{i}]" + (f" ({name})" if isinstance(name, str) else "")
        if not isinstance(name, str) or not name:
            raise SpecError(
                f"{where}: name is missing (the column's header name, or a name of your choice)"
            )
        role = entry.get("role")
        if role not in ROLES:
            shown, near = (
                ("missing", "") if role is None else (f"{role!r}", _near(str(role), ROLES))
            )
            raise SpecError(f"{where}: role is {shown}, expected one of {', '.join(ROLES)}{near}")
        columns.append(_build(COLUMN_TYPES[role], entry, where, skip=("role",)))
    try:
        return FeatureSpec(text, tuple(columns))
    except ValueError as e:
        raise SpecError(f"{source}: {e}") from None


def load_spec(path: str | Path) -> FeatureSpec:
    """Read a spec file; SpecError names the file, and the key where one is to blame."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as e:
        raise SpecError(f"{path}: cannot read the spec ({e.strerror or e})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SpecError(f"{path}: not a TOML spec ({e})") from None
    return spec_from_dict(raw, str(path))


def spec_to_toml(spec: FeatureSpec, notes: dict[str, str] | None = None, preamble: str = "") -> str:
    """The spec as a TOML file that load_spec reads back equal; every key written but unset ones.

    notes: column name -> a comment written above its table (what infer saw); preamble: comment
        lines first.
    """
    lines = [f"# {line}" if line else "#" for line in preamble.splitlines()]
    lines += ["[format]"]
    parquet = spec.format.kind == "parquet"  # columns by name: no text keys
    lines += [
        f"{f.name} = {toml_value(getattr(spec.format, f.name))}"
        for f in fields(spec.format)
        if not parquet or f.name == "kind"
    ]
    lines = [line for line in lines if not line.endswith(("= None", "= []"))]
    for column in spec.columns:
        lines.append("")
        if notes and column.name in notes:
            lines += [f"# {line}" for line in notes[column.name].splitlines()]
        lines += [
            "[[columns]]",
            f"name = {toml_value(column.name)}",
            f"role = {toml_value(column.role)}",
        ]
        for f in fields(column):
            value = getattr(column, f.name)
            if parquet and f.name == "separator":  # a Parquet list column holds its values apart
                continue
            if f.name != "name" and value is not None and value != {}:
                lines.append(f"{f.name} = {toml_value(value)}")
    return "\n".join(lines) + "\n"


def manifest_spec(manifest: Manifest, directory: str | Path = "") -> FeatureSpec | None:
    """The spec a dataset was made with: the one its manifest records (preprocess --spec), or the
    built-in Criteo spec of a run without one (from its schema and dense transform options); None
    for a dataset that `shardrec preprocess` did not write (torchrec's layout). A multi-hot copy
    keeps its source's spec: raw rows are read by it, then expanded.
    """
    options = manifest.options
    if "spec" in options:
        return spec_from_dict(options["spec"], f"{Path(directory) / MANIFEST}: options.spec")
    if isinstance(options.get("schema"), dict) and options.get("dense_transform"):
        return criteo_spec(**options["schema"], dense_transform=options["dense_transform"])
    return None


def applied_spec(manifest: Manifest, directory: str | Path = "") -> FeatureSpec | None:
    """The spec as `shardrec preprocess` applied it: manifest_spec with each hashed feature's
    table rows (what --max-ids gave a column without a hash_size) written as its hash_size, so that
    `preprocess --spec` with it makes the same tables. Vocabulary mode (its tables are the
    vocabularies') and a manifest without one size per sparse feature keep the spec as recorded;
    so does a spec the sizes would make invalid (columns sharing one table given two sizes), whose
    sizes then go back as --max-ids (tools/preprocess/settings.py, flags_to_repeat)."""
    return sized_spec(manifest_spec(manifest, directory), manifest.options)


def sized_spec(spec: FeatureSpec | None, options: dict) -> FeatureSpec | None:
    """applied_spec of a spec and the preprocessing options it was applied with (a manifest's, or
    a run's copy of them in RUN/dataset.json, which outlives its data)."""
    sizes = options.get("max_ids")
    if spec is None or options.get("mode") == "vocab" or not isinstance(sizes, list):
        return spec
    if len(sizes) == 1:
        sizes = sizes * len(spec.sparse)
    if len(sizes) != len(spec.sparse) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 2 for n in sizes
    ):
        return spec
    sized = {
        c.name: replace(c, hash_size=n)
        for c, n in zip(spec.sparse, sizes)
        if c.hash_size is None and not getattr(c, "raw", False)  # a raw sequence has no table
    }
    try:
        return FeatureSpec(spec.format, tuple(sized.get(c.name, c) for c in spec.columns))
    except ValueError:
        return spec
