"""Which settings a resume or a continuation may change, and how a change is said: the job's
settings as section.key (a table's as tables.FEATURE.key), those that differ from the run's
config.toml, and the --allow-change keys that accept them.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import shlex
from pathlib import Path
from typing import Any

from shardrec.trainer.job import table_changes
from shardrec.trainer.job.config import TABLES, JobConfig, load_job_config
from shardrec.trainer.job.sections import SEED_UNSET
from shardrec.trainer.rundir import names

CONTINUATION_KEYS = ("train.steps", "train.epochs")
"""Keys a resume may change without --allow-change when the run ends no earlier for it: raising them
is how a run continues (shortening it is a change like any other)."""


FREE_KEYS = (
    "data.path",
    "sharding.plan",
    "sharding.constraints",
    "dist.bind_cores",
    "dist.timeout_s",
    "data.num_workers",
    "data.multihot_cache",
    "train.log_interval",
    "checkpoint.interval_steps",
    "checkpoint.keep",
    "checkpoint.timeout_s",
    "checkpoint.stop_grace_s",
)
"""Keys a resume may always change: data.path may move as long as the data is the same (the
fingerprint decides, not the path); a checkpoint reshards onto any plan (at any world size);
the rest change no result: where the ranks' threads run and how long they wait, the loader's
threads (batches come in order whatever their count), the folder the multi-hot index tables are
drawn into (their seed and sizes draw the same tables anywhere), how often progress is logged, and
when checkpoints are written and how many kept (a resume is exact from any step)."""


STREAM_KEYS = (
    "train.seed",
    "train.global_batch_size",
    "data.shuffle",
    "data.tail",
    "data.train_split",
    "data.multihot_sizes",
    "data.multihot_rows",
    "data.multihot_dist",
    "data.multihot_seed",
)
"""Keys a resume can never change, --allow-change or not: they make the run's data stream (its
order, its batches, its last batch, the split it reads, the multi-hot ids made from its one-hot
ids), and a resume goes on in the middle of it, where the checkpoint's loader state left it (the
ranks would refuse that state, the checkpoint loaded)."""


CHECKPOINT_KEYS = ("model", "optim.sparse", "optim.dense", "data.multihot_rows")
"""Keys (a section for all its keys) a run keeps for good, --allow-change or not, resumed or going
on: they shape what its checkpoints hold (the model, the rows of its tables, the optimizers'
state), which a checkpoint of another shape is refused for by the ranks, once they started."""


def check_checkpoint_shape(run_dir: Path, changes: dict[str, tuple[Any, Any]]) -> None:
    """ValueError (one line) where `changes` touch what the run's checkpoints hold
    (CHECKPOINT_KEYS)."""
    fixed = {
        k: v
        for k, v in changes.items()
        if any(k == c or k.startswith(c + ".") for c in CHECKPOINT_KEYS)
    }
    if fixed:
        raise ValueError(
            f"{run_dir}: {changes_text(fixed)}: the shape of the run's model and optimizer "
            f"state, which its checkpoints hold; set {'it' if len(fixed) == 1 else 'them'} back, "
            "or start a new run (--restart, or another --out-dir)"
        )


def check_stream(run_dir: Path, changes: dict[str, tuple[Any, Any]]) -> None:
    """ValueError (one line) where `changes` touch the data stream's settings (STREAM_KEYS)."""
    fixed = {k: v for k, v in changes.items() if k in STREAM_KEYS}
    if fixed:
        raise ValueError(
            f"{run_dir}: {changes_text(fixed)}: the run's data stream, which a resume goes on "
            f"in the middle of; set {'it' if len(fixed) == 1 else 'them'} back, or start a new "
            "run (--restart, or another --out-dir)"
        )


def with_absolute_paths(config: JobConfig) -> JobConfig:
    """`config` with data.path and sharding.plan (where set) resolved from this directory: a run's
    config.toml must find its data and plan from wherever eval, export or a later
    `--continue-on` run, never a file of the same name in that directory."""
    data, sharding = config.data, config.sharding
    if data.path:
        data = dataclasses.replace(data, path=str(Path(data.path).resolve()))
    if sharding.plan:
        sharding = dataclasses.replace(sharding, plan=str(Path(sharding.plan).resolve()))
    return dataclasses.replace(config, data=data, sharding=sharding)


def flat_settings(config: JobConfig) -> dict[str, Any]:
    """section.key -> value of every setting; tables.FEATURE.key for a table's (table_changes)."""
    return {
        **{
            f"{section}.{key}": value
            for section, values in config.to_dict().items()
            if section != TABLES
            for key, value in values.items()
        },
        **table_changes.flat_tables(config.tables),
    }


def setting_changes(saved: JobConfig, current: JobConfig) -> dict[str, tuple[Any, Any]]:
    """section.key -> (old, new) for every setting that differs.

    data.path and sharding.plan are compared resolved, as config.toml saves them: a rerun of the
    same command with a relative --data or --plan is the same file, not a change to announce. An
    unset train.seed is the run's (config.toml keeps the seed a run drew or was given)."""
    if current.train.seed == SEED_UNSET:
        current = dataclasses.replace(
            current, train=dataclasses.replace(current.train, seed=saved.train.seed)
        )
    old, new = flat_settings(saved), flat_settings(with_absolute_paths(current))
    changes = {
        key: (old[key], new[key])
        for key in old
        if not key.startswith(f"{TABLES}.") and old[key] != new[key]
    }
    return {**changes, **table_changes.table_changes(saved.tables, current.tables)}


def recorded_seed(run_dir: Path) -> int | None:
    """The train.seed a run directory's config.toml keeps (None: no run there yet)."""
    path = Path(run_dir) / names.CONFIG
    return load_job_config(path).train.seed if path.is_file() else None


def check_allow_keys(keys: list[str]) -> None:
    """Every --allow-change KEY names a setting (section.key) or a whole section; a table's
    setting is tables.FEATURE.key (table_changes)."""
    known = flat_settings(JobConfig())
    sections = {key.partition(".")[0] for key in known} | {TABLES}
    for key in keys:
        if key not in known and key not in sections and not table_changes.is_table_key(key):
            feature = key.split(".")[1] if key.startswith(f"{TABLES}.") else "FEATURE"
            tables = [f"{TABLES}.{feature}.{k}" for k in table_changes.SETTINGS]
            near = difflib.get_close_matches(key, [*known, *sections, *tables], n=1)
            hint = f"; did you mean {near[0]}?" if near else " (see `shardrec config defaults`)"
            raise ValueError(f"--allow-change {key}: no such setting{hint}")


def allowed(key: str, allow: list[str], continues: bool) -> bool:
    """Whether a resume may change `key`; `continues`: the run ends no earlier for the change."""
    key, allow = table_changes.plain(key), [table_changes.plain(a) for a in allow]
    return (
        (key in CONTINUATION_KEYS and continues)
        or key in FREE_KEYS
        or any(key == a or key.startswith(a + ".") for a in allow)
    )


def show_value(value: Any) -> str:
    """A setting's value in a message: strings quoted, the rest as JSON."""
    return json.dumps(value) if not isinstance(value, str) else repr(value)


def changes_text(changes: dict[str, tuple[Any, Any]]) -> str:
    """`key: old -> new, ...` of changed settings."""
    return ", ".join(
        f"{k}: {show_value(old)} -> {show_value(new)}" for k, (old, new) in changes.items()
    )


def allow_flags(keys: Any) -> str:
    """The --allow-change flags that accept `keys`, quoted for a shell (`tables."*".policy`)."""
    return " ".join(f"--allow-change {shlex.quote(k)}" for k in keys)
