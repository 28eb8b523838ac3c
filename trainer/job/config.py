"""The job configuration: JobConfig, its sections (sections.py and model_section.py, the one home
of every default) and its `[tables.FEATURE]` settings, written as a job file and loaded from one.

Precedence, lowest to highest: the dataclass defaults, then the TOML job file
(`--config`), then each `--set section.key=value` in the order given. Validation lives in
`__post_init__` and names the key and the bad value.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, get_origin, get_type_hints

from shardrec.embeddings.managed.table_kinds import TableSettings
from shardrec.trainer.job.model_section import ModelConfig
from shardrec.trainer.job.sections import (
    CheckpointConfig,
    DataConfig,
    DistConfig,
    EvalConfig,
    OptimConfig,
    ShardingConfig,
    TrainConfig,
)
from shardrec.trainer.job.toml_values import (
    did_you_mean,
    field_help,
    key_lines,
    toml_key,
    toml_value,
    type_words,
)

TABLES = "tables"
"""The section of per-table settings: `[tables.FEATURE]`, one TableSettings each (a table's kind,
and a managed table's row budget and id map)."""


@dataclass
class JobConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    tables: dict[str, TableSettings] = field(default_factory=dict)
    """Per sparse feature (`[tables.FEATURE]`): its table's kind and, for a raw-id feature, its row
    budget and id map (embeddings.managed.table_kinds). A feature not named has a static table."""
    key_origins: ClassVar[dict[tuple[str, ...], str]] = {}
    """Where each key was set (`job.toml:12: `, `--set '...': `), by its dotted path; not a
    setting (no part of to_dict or a fingerprint). Set by load_job_config."""

    def located(self, message: str) -> str:
        """`message`, about the setting it starts with (`sharding.constraints.t_C3.sharding_types:
        ...`), prefixed with where that setting was given, the nearest enclosing key's place;
        unchanged where none is known."""
        # A quoted part (`tables."*".max_age`) is the key the job file quoted: origins hold it bare.
        head = re.match(r'[A-Za-z_][\w-]*(?:\.(?:[\w-]+|"[^"]*"))*', message)
        if head is None:
            return message
        path = [part.strip('"') for part in re.findall(r'[\w-]+|"[^"]*"', head[0])]
        for n in range(len(path), 0, -1):
            where = self.key_origins.get(tuple(path[:n]))
            if where:
                return where + message
        return message

    def with_changes(self, **changes: Any) -> JobConfig:
        """dataclasses.replace that keeps where each setting was given (`key_origins`)."""
        changed = dataclasses.replace(self, **changes)
        changed.key_origins = self.key_origins
        return changed

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_toml(self, comments: bool = False) -> str:
        """The resolved config, as a job file (kept in every run directory); with `comments`, each
        key's docstring above it (`shardrec config defaults`, which also shows a `[tables.FEATURE]`
        section's keys)."""
        lines = []
        for section, values in self.to_dict().items():
            if section == TABLES:
                continue
            helps = field_help(type(getattr(self, section))) if comments else {}
            lines.append(f"[{section}]")
            for key, value in values.items():
                if key in helps:
                    lines.append(f"# {' '.join(helps[key].split())}")
                lines.append(f"{key} = {toml_value(value)}")
            lines.append("")
        tables = dict(self.to_dict()[TABLES])
        # With no table named, `config defaults` shows a table's keys commented out: its output
        # stays a job file that loads (FEATURE names no feature of any dataset).
        example = comments and not tables
        if example:
            tables = {"FEATURE": dataclasses.asdict(TableSettings())}
            lines.append(
                "# Per raw-id feature (preprocess --raw-ids), its table: one section each,"
            )
            lines.append('# FEATURE its name, or "*" for every raw-id feature not named.')
        mark = "# " if example else ""
        helps = field_help(TableSettings) if comments else {}
        for feature, values in tables.items():
            lines.append(f"{mark}[{TABLES}.{toml_key(feature)}]")
            for key, value in values.items():
                if key in helps:
                    lines.append(f"# {' '.join(helps[key].split())}")
                lines.append(f"{mark}{key} = {toml_value(value)}")
            lines.append("")
        return "\n".join(lines)


_FALSE_WORDS = ("false", "no", "off", "n", "f")
"""How a false bool is often typed: the hint for such a --set value says `false`."""


def _sections_with(name: str) -> list[str]:
    """The sections of JobConfig that have a key `name` (a key put in the wrong section)."""
    hints = get_type_hints(JobConfig)
    return [
        f.name
        for f in fields(JobConfig)
        if f.name != TABLES and name in {k.name for k in fields(hints[f.name])}
    ]


def _near_miss(name: str, known: Any) -> str:
    """`; did you mean ...?` for an unknown key `name` of a section: that it is another section's
    (train's dense_lr is optim's) before a near spelling in this one (train.device)."""
    elsewhere = _sections_with(name)
    if elsewhere:
        return f"; it is a key of {' and '.join(f'[{s}]' for s in elsewhere)}"
    return did_you_mean(name, known)


def _parse_override(item: str, hint: Any, dotted: str = "KEY") -> Any:
    """Parse a --set value as TOML when it is one, else as a bare string; ValueError says how a
    value of the key's type is written."""
    try:
        return tomllib.loads(f"v = {item}")["v"]
    except tomllib.TOMLDecodeError:
        if hint is str:
            return item
        kind = get_origin(hint) or hint
        if kind is list:
            bare = ", ".join(v.strip() for v in item.strip("[]()").split(",") if v.strip())
            example = f"--set '{dotted}=[{bare}]'"
            raise ValueError(
                f"cannot parse {item!r} as a value; a list is written in brackets: {example}"
            ) from None
        if kind is dict:
            raise ValueError(
                f"cannot parse {item!r} as a value; a table is written in braces, as TOML's inline "
                f"tables, its strings in quotes: --set '{dotted}={{ key = \"text\", n = 1 }}'"
            ) from None
        if kind is bool:  # `False`, `no`: the advice below (a string in quotes) would not load
            raise ValueError(
                f"cannot parse {item!r} as a value; {dotted} is true or false, in lowercase: "
                f"--set {dotted}={'false' if item.lower() in _FALSE_WORDS else 'true'}"
            ) from None
        if kind in (int, float):
            raise ValueError(
                f"cannot parse {item!r} as a value; {dotted} is {type_words(hint)}"
            ) from None
        raise ValueError(
            f"cannot parse {item!r} as a value; write it as in a TOML file (a string in quotes)"
        ) from None


def _build_section(cls: type, key: str, raw: dict[str, Any], origin: dict[str, str]) -> Any:
    """origin: key -> where its value came from ("FILE: " or "--set 'ITEM': "), prefixed to
    errors."""
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(raw) - known)
    if unknown:
        name = unknown[0]
        near = _near_miss(name, known) if "." not in key else did_you_mean(name, known)
        raise ValueError(f"{origin.get(name, '')}unknown key {name!r} in [{key}]{near}")
    for name, value in raw.items():
        expected = get_origin(hints[name]) or hints[name]
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            raw[name] = float(value)
        elif not isinstance(raw[name], expected) or (expected is int and isinstance(value, bool)):
            raise ValueError(
                f"{origin.get(name, '')}{key}.{name} = {toml_value(value)} should be "
                f"{type_words(hints[name])}"
            )
    try:
        return cls(**raw)
    except ValueError as e:
        # __post_init__ names the key (or one inside it: sharding.constraints.t_C1); the file (or
        # --set) it came from is added when one key is to blame.
        said = f"{e} "
        sources = {
            origin[n]
            for n in raw
            if n in origin and (f"{key}.{n} " in said or f"{key}.{n}." in said)
        }
        raise ValueError(f"{sources.pop() if len(sources) == 1 else ''}{e}") from None


def load_job_config(
    path: str | Path | None = None, overrides: Sequence[str | tuple[str, str]] | None = None
) -> JobConfig:
    """Build a JobConfig: defaults, then the TOML file at `path`, then `section.key=value`
    overrides.

    An override given as (ITEM, FLAG) stands for a flag (`--steps 5` is train.steps=5): an error
    about its value names FLAG, as the user typed it, not a --set they never typed."""
    raw: dict[str, dict[str, Any]] = {}
    lines: dict[tuple[str, ...], int] = {}
    if path is not None:
        path = Path(path)
        try:
            text = path.read_text()
            raw = tomllib.loads(text)
        except OSError as e:
            raise ValueError(f"{path}: cannot read job file: {e.strerror}") from None
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: not valid TOML: {e}") from None
        lines = key_lines(text)

    def at(*keys: str) -> str:
        """`path:LINE: ` of the nearest line that sets `keys` (or a table holding them)."""
        for n in range(len(keys), 0, -1):
            if keys[:n] in lines:
                return f"{path}:{lines[keys[:n]]}: "
        return f"{path}: "

    sections = {f.name: f.type for f in fields(JobConfig)}
    section_types = {
        k: v for k, v in get_type_hints(JobConfig).items() if k in sections and k != TABLES
    }
    for name in raw:
        owners = [] if isinstance(raw[name], dict) else _sections_with(name)
        if name not in sections and owners:  # `steps = 5` above every [section]
            raise ValueError(
                f"{at(name)}{name} = {toml_value(raw[name])} is set before any section: put it "
                f"under {' or '.join(f'[{s}]' for s in owners)}"
            )
        if name not in sections:
            raise ValueError(f"{path}: unknown section [{name}]{did_you_mean(name, sections)}")
        if not isinstance(raw[name], dict):
            raise ValueError(f"{path}: {name} must be a [{name}] table")
    origin = {(s, k): at(s, k) for s, values in raw.items() for k in values}
    located = {keys: f"{path}:{line}: " for keys, line in lines.items()}
    for given in overrides or []:
        item, shown = given if isinstance(given, tuple) else (given, f"--set {given!r}")
        section, key, value = _apply_override(item, raw, sections, section_types)
        origin[(section, key)] = f"{shown}: "
        dotted = tuple(item.split("=", 1)[0].strip().split("."))
        located = {k: v for k, v in located.items() if k[: len(dotted)] != dotted}
        located[dotted] = f"{shown}: "
    built: dict[str, Any] = {}
    for name, cls in section_types.items():
        where = {k: v for (s, k), v in origin.items() if s == name}
        built[name] = _build_section(cls, name, dict(raw.get(name, {})), where)
    built[TABLES] = _build_tables(raw.get(TABLES, {}), origin, located)
    config = JobConfig(**built)
    config.key_origins = located
    return config


def _build_tables(
    raw: dict[str, Any],
    origin: dict[tuple[str, str], str],
    located: dict[tuple[str, ...], str],
) -> dict[str, TableSettings]:
    """`[tables.FEATURE]` sections -> TableSettings, each checked (errors name tables.FEATURE.key,
    prefixed with the line that set the key where one is to blame, else the table's)."""
    out = {}
    for feature, values in raw.items():
        key = f"{TABLES}.{toml_key(feature)}"  # tables."*" as the job file spells it
        where = origin.get((TABLES, feature), "")
        if not isinstance(values, dict):
            raise ValueError(
                f"{where}{key} = {values!r} should be a table of settings ([{key}] with kind, "
                "rows, ...)"
            )
        lines = {k: located.get((TABLES, feature, k), where) for k in values}
        settings = _build_section(TableSettings, key, dict(values), lines)
        try:
            settings.check(key, rows_given="rows" in values)
        except ValueError as e:  # the key's own line where the message names one key
            blamed = {lines[n] for n in values if f"{key}.{n} " in f"{e} "}
            raise ValueError(f"{blamed.pop() if len(blamed) == 1 else where}{e}") from None
        out[feature] = settings
    return out


def _apply_override(
    item: str, raw: dict[str, dict[str, Any]], sections: Any, section_types: dict[str, type]
) -> tuple[str, str, Any]:
    """Parse one --set KEY=VALUE into `raw`; returns (section, key, value)."""
    dotted, sep, value = item.partition("=")
    section, _, key = dotted.strip().partition(".")
    if not sep or not key:
        raise ValueError(
            f"--set {item!r}: expected KEY=VALUE with KEY as section.key (e.g. train.seed=1)"
        )
    if section == TABLES:
        return _apply_table_override(item, key, value, raw)
    if section not in sections:
        raise ValueError(
            f"--set {item!r}: unknown section {section!r}{did_you_mean(section, sections)}"
        )
    hints = get_type_hints(section_types[section])
    if key not in hints:
        elsewhere = _sections_with(key)
        near = (
            f"; did you mean {' or '.join(f'{s}.{key}' for s in elsewhere)}?"
            if elsewhere
            else did_you_mean(f"{section}.{key}", [f"{section}.{k}" for k in hints])
        )
        raise ValueError(f"--set {item!r}: unknown key {section}.{key}{near}")
    try:
        parsed = _parse_override(value.strip(), hints[key], f"{section}.{key}")
    except ValueError as e:
        raise ValueError(f"--set {item!r}: {e}") from None
    raw.setdefault(section, {})[key] = parsed
    return section, key, parsed


def _apply_table_override(
    item: str, key: str, value: str, raw: dict[str, dict[str, Any]]
) -> tuple[str, str, Any]:
    """--set tables.FEATURE.KEY=VALUE (one setting) or tables.FEATURE={...} (the whole table)."""
    feature, _, name = key.rpartition(".")
    hints = get_type_hints(TableSettings)
    if not feature:
        feature, name = name, ""
    feature = feature.strip('"')  # tables."*".rows: the defaults of every raw-id feature
    if name and name not in hints:
        dotted = [f"{TABLES}.{toml_key(feature)}.{k}" for k in hints]
        raise ValueError(
            f"--set {item!r}: unknown key {TABLES}.{key}{did_you_mean(f'{TABLES}.{key}', dotted)}"
        )
    try:
        parsed = _parse_override(value.strip(), hints[name] if name else dict, f"{TABLES}.{key}")
    except ValueError as e:
        raise ValueError(f"--set {item!r}: {e}") from None
    tables = raw.setdefault(TABLES, {})
    if name:
        current = tables.setdefault(feature, {})
        if not isinstance(current, dict):
            raise ValueError(f"--set {item!r}: {TABLES}.{feature} is not a table of settings")
        current[name] = parsed
    else:
        tables[feature] = parsed
    return TABLES, feature, parsed
