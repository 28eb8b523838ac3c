"""A run directory's life: new, resumed, complete; what may change between its invocations.

A rerun of a finished run must write nothing; a resume must not change settings behind the
user's back (resume_settings.py); a changed dataset can never resume (trained_data.py).
`check_run_dir` decides which case a job is in before any rank starts (so a refusal is one line),
and `move_aside` starts a run over without deleting the old one. The run directory keeps
`config.toml` (the resolved settings of its last invocation) and `dataset.json` (the dataset's
path and fingerprint).
"""

from __future__ import annotations

import os
from pathlib import Path

from shardrec.dataloader.format.fingerprints import dataset_fingerprint
from shardrec.dataloader.format.manifest import Manifest
from shardrec.trainer.job import data_options, table_changes
from shardrec.trainer.job.config import JobConfig, load_job_config
from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.life.resume_settings import (
    allow_flags,
    allowed,
    changes_text,
    check_allow_keys,
    check_checkpoint_shape,
    check_stream,
    setting_changes,
    show_value,
)
from shardrec.trainer.rundir.life.run_state import RunDir, metrics_records, read_run_dir
from shardrec.trainer.rundir.life.stretches import current_start
from shardrec.trainer.rundir.life.trained_data import (
    read_dataset_record,
    recorded_data,
    spec_differences,
)


def planned_steps(config: JobConfig, manifest: Manifest) -> int:
    """The step a job ends at: train.steps, or its epochs over the train split."""
    return data_options.train_steps(manifest, config.data, config.train)


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
        check_stream(run_dir, changes)
        check_checkpoint_shape(run_dir, changes)
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
    trained = [r for r in metrics_records(run_dir) if r.get("kind") == "train"]
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
        "a run cannot resume on a changed dataset; to train the run on it as new data (the next "
        f"day's), give --continue-on {path} in place of --data; or start over with --restart or "
        "use another --out-dir"
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
