"""The `[tables.FEATURE]` settings as a resume or a continuation compares them: one key per table
setting, spelt as a job file spells it (`tables."*".policy`, `tables.C3.rows`), so that a
changed setting is named by a key that `--allow-change` accepts.

Which changes a run may take: a table's policy, admit_after, evict_every, max_age, candidates
and decay only steer the id map's later updates (the map holds every slot's count and last step whatever
the policy), so `--allow-change` accepts them. Its kind and rows are the checkpoint's shapes (the
table's rows, its id map's slots, or none): those are refused outright.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from shardrec.embeddings.managed.table_kinds import TableSettings
from shardrec.trainer.job.config import TABLES
from shardrec.trainer.job.toml_values import toml_key

FIXED = ("kind", "rows")
"""Table settings a run keeps for good."""
SETTINGS = tuple(f.name for f in dataclasses.fields(TableSettings))


def table_key(feature: str, name: str = "") -> str:
    """`tables.FEATURE[.NAME]` as a job file spells it (`tables."*".policy`)."""
    return f"{TABLES}.{toml_key(feature)}" + (f".{name}" if name else "")


def plain(key: str) -> str:
    """A key without quotes: `tables."*".policy` and `tables.*.policy` are the same setting."""
    return key.replace('"', "")


def flat_tables(tables: dict[str, TableSettings]) -> dict[str, Any]:
    """tables.FEATURE.KEY -> value of every table setting."""
    return {
        table_key(feature, name): value
        for feature, settings in tables.items()
        for name, value in dataclasses.asdict(settings).items()
    }


def table_changes(
    old: dict[str, TableSettings], new: dict[str, TableSettings]
) -> dict[str, tuple[Any, Any]]:
    """key -> (old, new) for each table setting that differs; a section on one side only is one
    change of the whole section (None on the other side)."""
    out: dict[str, tuple[Any, Any]] = {}
    for feature in [*old, *(f for f in new if f not in old)]:
        if feature not in old or feature not in new:
            was, now = old.get(feature), new.get(feature)
            out[table_key(feature)] = tuple(
                dataclasses.asdict(s) if s is not None else None for s in (was, now)
            )  # type: ignore[assignment]
            continue
        a, b = dataclasses.asdict(old[feature]), dataclasses.asdict(new[feature])
        out.update({table_key(feature, k): (a[k], b[k]) for k in a if a[k] != b[k]})
    return out


def is_table_key(key: str) -> bool:
    """Whether an --allow-change KEY names the tables section, a table or one of its settings."""
    section, _, rest = plain(key).partition(".")
    if section != TABLES:
        return False
    feature, _, name = rest.partition(".")
    return not rest or (bool(feature) and (not name or name in SETTINGS))


def check_fixed(run_dir: Path, changes: dict[str, tuple[Any, Any]], show: Any) -> None:
    """ValueError (one line) where a change touches a table's kind or rows."""
    for key, (old, new) in changes.items():
        if key.startswith(f"{TABLES}.") and key.rpartition(".")[2] in FIXED:
            raise ValueError(
                f"{run_dir}: {key}: {show(old)} -> {show(new)}: a table's kind and rows are the "
                "run's for good (its checkpoints hold the table and its id map); set it back, or "
                "start a new run (--restart, or another --out-dir)"
            )
