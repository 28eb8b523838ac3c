"""A run directory's life: new, resumed, complete; what may change between its invocations.

A rerun of a finished run must write nothing; a resume must not change settings behind the
user's back; a changed dataset can never resume. `check_run_dir` decides which case a job is
in before any rank starts (so a refusal is one line), and `move_aside` starts a run over
without deleting the old one. The run directory keeps `config.toml` (the resolved settings of
its last invocation) and `dataset.json` (the dataset's path and fingerprint).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardrec.dataloader.format.manifest import (
    Manifest,
    SparseFeature,
    dataset_fingerprint,
    older_fingerprints,
)
from shardrec.dataloader.spec.event_spec import event_spec_from_dict
from shardrec.dataloader.util import locks
from shardrec.trainer.job import data_options, table_changes
from shardrec.trainer.job.config import SEED_UNSET, TABLES, JobConfig, load_job_config
from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.checkpoint_trust import complete_checkpoints
from shardrec.trainer.rundir.metrics_log import append_record, load_metrics
from shardrec.trainer.rundir.stretches import current_start

STOPPED_EXIT_CODE = 75
"""`shardrec train`'s exit code after a stop on request with its checkpoint written (EX_TEMPFAIL:
rerun to resume)."""
CONTINUATION_KEYS = ("train.steps", "train.epochs")
"""Keys a resume may change without --allow-change when the run ends no earlier for it: raising them
is how a run continues (shortening it is a change like any other)."""
FREE_KEYS = ("data.path", "sharding.plan", "sharding.constraints")
"""Keys a resume may always change: data.path may move as long as the data is the same (the
fingerprint decides, not the path); a checkpoint reshards onto any plan (at any world size)."""


def table_rows(feature: SparseFeature) -> int | None:
    """The rows of a feature's table; None for values no table holds (an event log's timestamps
    and action bits): their largest value is no size a model depends on, and a later period of
    the same log has larger timestamps."""
    return feature.cardinality if feature.values == "ids" else None


def dataset_schema(manifest: Manifest) -> dict[str, Any]:
    """What a model trained on a dataset needs of another to score it: its features and
    cardinalities (None: no table, see table_rows)."""
    return {
        "dense": list(manifest.dense_features),
        "sparse": [[f.name, table_rows(f), f.multi_hot] for f in manifest.sparse_features],
    }


def same_feature(trained: list[Any], here: list[Any]) -> bool:
    """Whether two [name, cardinality, multi-hot] entries of dataset_schema agree; a cardinality
    of None on either side (no table; a record from before table_rows kept the largest value)
    is not compared."""
    (name, rows, multi), (name2, rows2, multi2) = trained, here
    return (name, multi) == (name2, multi2) and (rows is None or rows2 is None or rows == rows2)


PREPROCESSING_KEYS = (
    "mode",
    "max_ids",
    "min_count",
    "hash",
    "missing_id",
    "oov_id",
    "dense_transform",
    "dense_dtype",
    "spec_sha256",
    "raw_ids",
)
"""The manifest options that decide which id and which dense value a raw field becomes (not Criteo's
text layout: the same rows as TSV or CSV give the same dataset; a feature spec, whose hash is here,
says which column is which)."""


def preprocessing(manifest: Manifest) -> dict[str, Any]:
    """A dataset's preprocessing settings: its table sizes, hashing or vocabulary and dense
    transform. A model scores only data preprocessed as its training data was (see
    preprocessing_differences)."""
    options = manifest.options
    return {
        "cardinalities": [table_rows(f) for f in manifest.sparse_features],
        **{key: options.get(key) for key in PREPROCESSING_KEYS},
        **(event_sample_settings(manifest.events["spec"]) if manifest.kind == "events" else {}),
    }


def event_sample_settings(spec: dict[str, Any]) -> dict[str, Any]:
    """The sample settings (EventSpec.sample_settings) of an event spec as a manifest or a model
    file keeps it."""
    return event_spec_from_dict(spec, "the dataset's event spec").sample_settings()


def preprocessing_differences(trained: dict[str, Any], here: dict[str, Any]) -> str:
    """The settings that differ, "key: A in training, B here, ..." ("" when none): of a list, its
    first differing element. A cardinality of None (no table) is not compared."""
    diffs = []
    for key in dict.fromkeys([*trained, *here]):
        a, b = trained.get(key), here.get(key)
        if key == "cardinalities" and isinstance(a, list) and isinstance(b, list):
            a, b = _tables_only(a, b)
        if key.startswith("[") and key not in trained:
            continue  # an event spec's setting that a record from before them does not keep
        if a == b:
            continue
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            i = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
            key, a, b = f"{key}[{i}]", a[i], b[i]
        diffs.append(f"{key}: {show_value(a)} in training, {show_value(b)} here")
    return ", ".join(diffs)


def spec_differences(record: dict[str, Any], manifest: Manifest) -> str:
    """The event-spec settings (EventSpec.sample_settings) in which `manifest`'s samples differ
    from those of the data a run recorded (RUN/dataset.json), preprocessing_differences' way; ""
    when none differ, for a click log, or for a record that keeps none."""
    if manifest.kind != "events":
        return ""
    trained = {k: v for k, v in record.get("preprocessing", {}).items() if k.startswith("[")}
    here = {k: v for k, v in preprocessing(manifest).items() if k.startswith("[")}
    return preprocessing_differences(trained, here) if trained else ""


def recorded_data(record: dict[str, Any], manifest: Manifest) -> bool:
    """Whether `manifest` is the dataset a run recorded: its fingerprint, or the form recorded
    before an event log's covered its spec (then the spec settings the record keeps, if any, must
    be the dataset's: a record from before them cannot tell, and is taken at its word)."""
    recorded = record.get("fingerprint")
    if recorded == dataset_fingerprint(manifest):
        return True
    return recorded in older_fingerprints(manifest) and not spec_differences(record, manifest)


def _tables_only(a: list[Any], b: list[Any]) -> tuple[list[Any], list[Any]]:
    """Two lists of cardinalities with None where either has none (a feature without a table)."""
    if len(a) != len(b):
        return a, b
    keep = [x is not None and y is not None for x, y in zip(a, b)]
    return [x if k else None for x, k in zip(a, keep)], [y if k else None for y, k in zip(b, keep)]


def dataset_record(path: str, manifest: Manifest, given: str | None = None) -> bytes:
    """The bytes of RUN/dataset.json for this dataset: its absolute `path`, the path as the user
    typed it (`given`), its fingerprint, schema and preprocessing settings."""
    record = {
        "path": path,
        "given": given if given is not None else path,
        "fingerprint": dataset_fingerprint(manifest),
        "schema": dataset_schema(manifest),
        "preprocessing": preprocessing(manifest),
    }
    return (json.dumps(record, indent=2) + "\n").encode()


def read_dataset_record(run_dir: Path) -> dict[str, Any] | None:
    """RUN/dataset.json (None: a run from before dataset records, or a torn file)."""
    try:
        record = json.loads((Path(run_dir) / names.DATASET_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def with_absolute_data_path(config: JobConfig) -> JobConfig:
    """`config` with data.path resolved from this directory: a run's config.toml must find its
    data from wherever eval or export run later."""
    if not config.data.path:
        return config
    return dataclasses.replace(
        config, data=dataclasses.replace(config.data, path=str(Path(config.data.path).resolve()))
    )


def planned_steps(config: JobConfig, manifest: Manifest) -> int:
    """The step a job ends at: train.steps, or its epochs over the train split."""
    return data_options.train_steps(manifest, config.data, config.train)


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

    data.path is compared resolved, as config.toml saves it: a rerun of the same command with a
    relative --data is the same dataset, not a change to announce. An unset train.seed is the
    run's (config.toml keeps the seed a run drew or was given)."""
    if current.train.seed == SEED_UNSET:
        current = dataclasses.replace(
            current, train=dataclasses.replace(current.train, seed=saved.train.seed)
        )
    old, new = flat_settings(saved), flat_settings(with_absolute_data_path(current))
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


@dataclass(frozen=True)
class RunDir:
    """What a run directory holds, read without torch."""

    path: Path
    step: int | None
    """Step of the newest complete checkpoint (None: none)."""
    summary: dict[str, Any] | None
    target: dict[str, Any] | None = None
    """The metrics.jsonl record of the train.target_auc stop that ended the run at `step` (None:
    none)."""
    stop: dict[str, Any] | None = None
    """The metrics.jsonl record of a stop on request (SIGTERM / SIGINT) at `step` (None: none)."""

    @property
    def complete(self) -> bool:
        """The last invocation finished: its summary is of the newest checkpoint's step."""
        return (
            self.summary is not None
            and self.step is not None
            and self.summary.get("steps") == self.step
        )

    def complete_for(self, config: JobConfig, total: int) -> bool:
        """Whether a job of `config`, which runs to step `total`, has nothing left to do here: the
        run finished at `total`, or it stopped at a target AUC that `config`'s target still
        accepts."""
        if not self.complete:
            return False
        if self.step == total:
            return True
        target = config.train.target_auc
        # A raised or cleared target (--allow-change train.target_auc) continues the run.
        return self.target is not None and bool(target) and self.target["auc"] >= target


def read_run_dir(path: Path) -> RunDir:
    done = complete_checkpoints(Path(path) / names.CHECKPOINTS)
    summary = None
    try:
        summary = json.loads((Path(path) / names.SUMMARY).read_text())
    except (OSError, ValueError):
        pass  # no summary, or a torn one: the run did not finish
    summary = summary if isinstance(summary, dict) else None
    step = done[-1][0] if done else None
    finished = summary is not None and summary.get("steps") == step
    target = (
        _newest_record(Path(path), ("target",), step)
        if finished and summary.get("target_reached")
        else None
    )
    # A stop counts until a later invocation resumes (which may then have failed); before the
    # first checkpoint, until a later invocation writes anything.
    stop = None
    if step is not None and not finished:
        stop = _newest_record(Path(path), ("stop", "resume"), step)
    elif step is None:
        stop = next(iter(_metrics_records(Path(path))[-1:]), None)
    return RunDir(
        Path(path), step, summary, target, stop if stop and stop.get("kind") == "stop" else None
    )


def _newest_record(
    run_dir: Path, kinds: tuple[str, ...], step: int | None
) -> dict[str, Any] | None:
    """The newest record of one of `kinds` in RUN/metrics.jsonl, if it is of `step`: a `target`
    record (trainer.loop.target) with its AUC, a `stop` or `resume` record
    (trainer.loop.train_loop)."""
    found = None
    for record in _metrics_records(run_dir):
        if record.get("kind") in kinds and (
            record["kind"] != "target" or isinstance(record.get("auc"), (int, float))
        ):
            found = record
    return found if found is not None and found.get("step") == step else None


def _metrics_records(run_dir: Path) -> list[dict[str, Any]]:
    """RUN/metrics.jsonl's records (none without the file); torn lines skipped."""
    if not (Path(run_dir) / names.METRICS).is_file():
        return []
    return load_metrics(run_dir, torn="any").records


def check_run_dir(run_dir: Path, config: JobConfig, manifest: Manifest, allow: list[str]) -> str:
    """ "new", "resume" or "complete" for this job in `run_dir`; ValueError (one line) if it cannot
    run there."""
    run = read_run_dir(run_dir)
    if run.step is None:
        _check_attempt(run_dir, config)
        return "new"
    _check_dataset(run_dir, manifest, config.data.path)
    # A run that goes on counts this stretch's steps from the step it started at.
    base = current_start(run_dir)
    total = base + planned_steps(config, manifest)
    if run.step > total:
        raise ValueError(
            f"{run_dir} has trained {run.step:,} steps, more than the {total:,} this job runs to "
            "(train.steps / train.epochs): a run cannot go back; raise --steps, or start over with --restart"
        )
    saved_path = run_dir / names.CONFIG
    if saved_path.is_file():
        saved = load_job_config(saved_path)
        changes = setting_changes(saved, config)
        table_changes.check_fixed(run_dir, changes, show_value)
        continues = total >= base + planned_steps(saved, manifest)
        refused = {k: v for k, v in changes.items() if not allowed(k, allow, continues)}
        if refused:
            raise ValueError(
                f"{run_dir}: resuming with changed settings ({changes_text(refused)}); "
                f"accept them with {allow_flags(refused)}, or start over with --restart"
            )
    return "complete" if run.complete_for(config, total) else "resume"


def _check_attempt(run_dir: Path, config: JobConfig) -> None:
    """A run stopped before its first checkpoint starts again from step 0, appending to its
    metrics.jsonl: with other settings, the file would mix two runs' lines unannounced."""
    saved_path = Path(run_dir) / names.CONFIG
    if not saved_path.is_file():
        return
    trained = [r for r in _metrics_records(run_dir) if r.get("kind") == "train"]
    changes = setting_changes(load_job_config(saved_path), config) if trained else {}
    if changes:
        shown = changes_text(changes)
        raise ValueError(
            f"{run_dir}: holds a run that stopped before its first checkpoint (step "
            f"{max(r.get('step', 0) for r in trained):,} logged) with other settings ({shown}); "
            "start over with --restart, or rerun with its settings"
        )


def resume_notice(run_dir: Path, config: JobConfig) -> str | None:
    """The line a resume says when settings differ from the run's (None: none differ), after
    check_run_dir accepted them: a resume never changes a setting without a word."""
    saved_path, run = Path(run_dir) / names.CONFIG, read_run_dir(run_dir)
    if not saved_path.is_file() or run.step is None:
        return None
    changes = setting_changes(load_job_config(saved_path), config)
    if not changes:
        return None
    shown = changes_text(changes)
    return f"{run_dir}: resuming from step {run.step:,} with changed settings: {shown}"


def check_job(run_dir: Path, config: JobConfig, allow: list[str]) -> str | None:
    """What every rank checks before it joins the group (a direct torchrun runs no `shardrec train`):
    the line a rerun of a complete run prints (None: train); ValueError (one line) if the job cannot
    run in `run_dir`, as `shardrec train` refuses it."""
    check_allow_keys(allow)
    if not config.data.path:
        raise ValueError("no dataset: pass --data DIR or set data.path in the job file")
    manifest = Manifest.load(config.data.path)
    if check_run_dir(run_dir, config, manifest, allow) != "complete":
        return None
    return complete_message(run_dir, config, read_run_dir(run_dir))


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


def _check_dataset(run_dir: Path, manifest: Manifest, path: str) -> None:
    record = read_dataset_record(run_dir)
    if record is None:
        return  # a run from before dataset records: nothing to compare
    if recorded_data(record, manifest):
        return
    differs = spec_differences(record, manifest)
    if differs:
        raise ValueError(
            f"{run_dir} was trained on data of another event spec than {path} now holds "
            f"({differs}): a run cannot resume on a changed dataset; preprocess the log into "
            f"{path} again with the run's spec, start over with --restart or use another --out-dir"
        )
    raise ValueError(
        f"{run_dir} was trained on other data ({record.get('path')}, fingerprint "
        f"{str(record.get('fingerprint'))[:12]}; this dataset's is {dataset_fingerprint(manifest)[:12]}): "
        "a run cannot resume on a changed dataset; start over with --restart or use another --out-dir"
    )


def complete_message(run_dir: Path, config: JobConfig, run: RunDir) -> str:
    """What a rerun of a finished run says: it is done, and what to change to continue."""
    step = run.step or 0
    if run.target is not None and run.target["auc"] >= (config.train.target_auc or float("inf")):
        t = run.target
        return (
            f"{run_dir} is complete: the target AUC was reached at step {step:,} ({t.get('split', 'val')} "
            f"AUC {t['auc']:.5f} >= train.target_auc = {t.get('target_auc')}); nothing to do. To continue it, "
            "raise or clear the target (--set train.target_auc=0 --allow-change train.target_auc); "
            "to start over, add --restart"
        )
    cap = (
        f"train.steps = {config.train.steps}"
        if config.train.steps
        else f"train.epochs = {config.train.epochs}"
    )
    return (
        f"{run_dir} is complete: {step:,} steps ({cap}); nothing to do. To continue it, raise --steps "
        "(or train.epochs); to start over, add --restart"
    )


def looks_like_run(directory: Path) -> bool:
    """Whether `directory` is empty or holds a run's files (what `--restart` may move aside): a
    directory of other files is not a run to start over."""
    directory = Path(directory)
    entries = {p.name for p in directory.iterdir()} - {names.LOCK}  # this job's, maybe
    marks = {names.CONFIG, names.METRICS, names.CHECKPOINTS, names.PLAN}
    return not entries or bool(entries & marks)


def move_aside(run_dir: Path) -> Path | None:
    """Rename a non-empty `run_dir` to the first free `NAME.1`, `NAME.2`, ...; returns the new path
    (None: nothing to move). Nothing is deleted: starting over must not lose a run."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or not any(run_dir.iterdir()):
        return None
    n = 1
    while run_dir.with_name(f"{run_dir.name}.{n}").exists():
        n += 1
    target = run_dir.with_name(f"{run_dir.name}.{n}")
    os.rename(run_dir, target)
    return target


def run_status(run: RunDir, active_seconds: float = 120.0) -> str:
    """complete, running, stopped or failed. Running: a job holds RUN/.lock (trainer.rundir.lock's
    flock), or, in a run without a lock file, metrics were written in the last `active_seconds`.
    Stopped: its last job stopped on request (a rerun resumes from its newest checkpoint, or
    starts over where it had none): after a checkpoint, or at once (record_stop_at_once)."""
    if run.complete:
        return "complete"
    lock, metrics = run.path / names.LOCK, run.path / names.METRICS
    if lock.is_file():
        running = locks.holder_of(lock) is not None
    else:
        running = metrics.is_file() and time.time() - metrics.stat().st_mtime < active_seconds
    if running:
        return "running"
    return "stopped" if run.stop is not None else "failed"


def record_stop_at_once(run_dir: Path, reason: str) -> None:
    """Record in RUN/metrics.jsonl that the launcher ended the job at once (a second signal, or no
    checkpoint within checkpoint.stop_grace_s): the run was stopped, not failed, and a rerun
    resumes from its newest complete checkpoint (step None: starts over). Nothing is written where
    rank 0 had not started the run (no config.toml): there is no run to list."""
    run_dir = Path(run_dir)
    if not (run_dir / names.CONFIG).is_file():
        return
    done = complete_checkpoints(run_dir / names.CHECKPOINTS)
    step = done[-1][0] if done else None
    append_record(run_dir, {"kind": "stop", "step": step, "reason": reason, "at_once": True})


def stopped_message(step: int) -> str:
    """What a job stopped by SIGTERM / SIGINT says last."""
    return f"stopped at step {step:,}; checkpoint written; rerun the same command to resume"


def find_runs(root: Path) -> list[Path]:
    """Run directories (a config.toml or checkpoints/ inside, or a job holding its lock: a run in
    its first seconds, before its rank 0 writes anything) at or under `root`, sorted."""
    root = Path(root)
    found = {p.parent for p in root.rglob(names.CONFIG)}
    found |= {p.parent for p in root.rglob(names.CHECKPOINTS) if p.is_dir()}
    found |= {p.parent for p in root.rglob(names.LOCK) if locks.holder_of(p) is not None}
    return sorted(p for p in found if names.CHECKPOINTS not in p.relative_to(root).parts)


def best_auc(run_dir: Path, split: str = "val", upto: int | None = None) -> float | None:
    """The best AUC of `split` in RUN/metrics.jsonl (None: no evaluation yet); torn lines
    skipped. Only evaluations of the models the run still holds: those past the step a later
    invocation resumed from, and past `upto` (the step a rerun resumes from), are left out."""
    kept: list[tuple[int, float]] = []
    for record in _metrics_records(run_dir):
        step = record.get("step")
        if record.get("kind") == "resume" and isinstance(step, int):
            kept = [(s, auc) for s, auc in kept if s <= step]
        elif (
            record.get("kind") == "eval"
            and record.get("split") == split
            and isinstance(record.get("auc"), (int, float))
            and isinstance(step, int)
        ):
            kept.append((step, record["auc"]))
    aucs = [auc for s, auc in kept if upto is None or s <= upto]
    return max(aucs) if aucs else None
