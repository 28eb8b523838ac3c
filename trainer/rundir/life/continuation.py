"""Whether a run may go on with other data (`shardrec train --continue-on DATA`), checked before
any rank starts (torch-free), so that a refusal is one line:
- a new stretch needs the run's current stretch to be complete and the new data to be made as the
  run's (the same features, static tables' rows, id modes, hashing and dense transform); data
  the run already trained on is refused;
- the current stretch's data again is that stretch: a rerun after a kill resumes it bit for bit
  (killed before its first checkpoint: it begins again), a rerun of a complete stretch says so and
  writes nothing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from shardrec.dataloader.format.fingerprints import dataset_fingerprint, older_fingerprints
from shardrec.dataloader.format.manifest import Manifest
from shardrec.trainer.job import table_changes
from shardrec.trainer.job.config import JobConfig, load_job_config
from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.life import lifecycle, resume_settings, run_state, trained_data
from shardrec.trainer.rundir.life.stretches import read_stretches, unsaved_stretch


def check_continue(run_dir: Path, config: JobConfig, manifest: Manifest, allow: list[str]) -> str:
    """What `--continue-on` with this job's data means for `run_dir`: "continue" (a new stretch),
    "resume" (the current stretch's data again, not finished) or "complete" (finished); ValueError
    (one line) when it cannot go on."""
    run = run_state.read_run_dir(run_dir)
    if run.step is None:
        raise ValueError(
            f"{run_dir}: no checkpoint to continue from; train it first (without --continue-on)"
        )
    record = trained_data.read_dataset_record(run_dir) or {}
    # A stretch recorded by an earlier shardrec keeps an older form of its data's fingerprint.
    new, older = dataset_fingerprint(manifest), older_fingerprints(manifest)
    stretches = read_stretches(run_dir)
    unsaved = unsaved_stretch(stretches, new, run.step, older)
    if trained_data.recorded_data(record, manifest) and unsaved is None:
        return lifecycle.check_run_dir(run_dir, config, manifest, allow)
    forms = (new, *older)
    earlier = next((s for s in stretches if s.fingerprint in forms and s is not unsaved), None)
    if earlier is not None:
        raise ValueError(
            f"{run_dir} already trained on this data (stretch {earlier.index}, {earlier.data}); "
            "a run goes on with data it has not seen"
        )
    current = stretches[-1] if stretches else None
    if current is not None and current.last_step is None and current is not unsaved:
        # Stopped before its first checkpoint: the summary still says the stretch before ended
        # complete, and its ranks would refuse the previous stretch's checkpoint for this data.
        raise ValueError(_unfinished(run_dir, current.data, run.step))
    if not run.complete and unsaved is None:
        raise ValueError(_unfinished(run_dir, record.get("path", "its data"), run.step))
    _check_same_making(run_dir, record, manifest)
    _check_settings(run_dir, config, allow)
    return "continue"


def _unfinished(run_dir: Path, data: str, step: int | None) -> str:
    at = f" (step {step:,})" if step is not None else ""
    return (
        f"{run_dir}: its current stretch (on {data}) is not complete{at}; finish it first: "
        f"rerun with --continue-on {data}"
    )


def check_no_unfinished_stretch(run_dir: Path, data: str) -> None:
    """For a job without --continue-on: ValueError (one line) where the run went on
    (stretches.json) and its current stretch is unfinished on other data than `data` (or none), or
    on `data` but stopped before its first checkpoint: going on is `--continue-on` with that
    stretch's data; the run's other refusals ('no dataset', 'trained on other data ...
    --restart', the ranks' 'checkpoint of another model') would send the user the wrong way."""
    if not Path(run_dir).is_dir():  # no run yet (or a file there, which the lock refuses)
        return
    stretches = read_stretches(run_dir)
    if not stretches or stretches[-1].last_step is not None:
        return
    current, step = stretches[-1].data, run_state.read_run_dir(run_dir).step
    # Its own data resumes it as a run, but only from a checkpoint of its own: one stopped before
    # its first still holds the previous stretch's, of other data.
    if (
        not data
        or Path(data).resolve() != Path(current).resolve()
        or step == stretches[-1].first_step
    ):
        raise ValueError(_unfinished(run_dir, current, step))


def _check_same_making(run_dir: Path, record: dict[str, Any], manifest: Manifest) -> None:
    """The new data has the run's features, static table rows and preprocessing."""
    schema = trained_data.dataset_schema(manifest)
    trained = record.get("schema", schema)
    if trained["dense"] != schema["dense"]:
        raise ValueError(
            f"dense features {schema['dense'][:4]}...: {run_dir} trained on "
            f"{trained['dense'][:4]}...; a run goes on with data of its features"
        )
    differs, one_side = trained_data.sparse_difference(trained["sparse"], schema["sparse"], run_dir)
    if one_side:
        raise ValueError(f"{differs}; a run goes on with data of its features")
    if differs:
        raise ValueError(f"{differs}: {_rows_remedy(manifest)}")
    differs = trained_data.preprocessing_differences(
        record.get("preprocessing", {}),
        trained_data.preprocessing(manifest),
        (trained_data.recorded_spec(record), manifest.options.get("spec")),
    )
    if differs:
        raise ValueError(
            f"the new data was preprocessed otherwise than the data {run_dir} trained on: "
            f"{differs}; {_rows_remedy(manifest, _spec_shown(run_dir, record))}"
        )


def _spec_shown(run_dir: Path, record: dict[str, Any]) -> str | None:
    """What `shardrec spec show` prints the run's data's spec from: that data while it is at its
    path, unchanged, else the run directory, whose RUN/dataset.json keeps a copy (day 0's folder
    is often gone by day 2); None where neither holds one."""
    path = record.get("path")
    if path and trained_data.data_at_path(record) is not None:
        return str(path)
    return str(run_dir) if isinstance(record.get("spec"), dict) else None


def _rows_remedy(manifest: Manifest, trained: str | None = None) -> str:
    """What makes new data's tables the run's: a spec's table sizes are its columns' hash_size,
    Criteo's the --max-ids; an event log's grow with its ids. `trained`: what `shardrec spec
    show` prints the run's data's spec from (_spec_shown; a spec inferred again from the new day
    proposes other hash sizes)."""
    if manifest.kind == "events":
        return (
            "an event log's tables have a row for each id up to its largest (users, items, "
            "artists, albums), and a run's tables keep their rows; go on with a log of the "
            "same ids"
        )
    spec = manifest.options.get("spec_sha256")
    same = "the same spec" if spec else "the same --max-ids"
    shown = f"; `shardrec spec show {trained}` prints it" if spec and trained else ""
    return f"preprocess the new data as the old ({same} and --raw-ids{shown})"


def _check_settings(run_dir: Path, config: JobConfig, allow: list[str]) -> None:
    """Settings as a resume allows them; train.steps and train.epochs count per stretch, so they
    may change freely."""
    saved_path = Path(run_dir) / names.CONFIG
    if not saved_path.is_file():
        return
    changes = resume_settings.setting_changes(load_job_config(saved_path), config)
    table_changes.check_fixed(run_dir, changes, resume_settings.show_value)
    resume_settings.check_checkpoint_shape(run_dir, changes)
    refused = {
        k: v
        for k, v in changes.items()
        if k not in resume_settings.CONTINUATION_KEYS
        and not resume_settings.allowed(k, allow, True)
    }
    if refused:
        raise ValueError(
            f"{run_dir}: going on with changed settings ({resume_settings.changes_text(refused)}); "
            f"accept them with {resume_settings.allow_flags(refused)}"
        )


def check_continuing_job(
    run_dir: Path, config: JobConfig, allow: list[str]
) -> tuple[str | None, bool]:
    """lifecycle.check_job for `--continue-on`: (the line a rerun of a complete stretch prints, or
    None to train; whether the job starts a new stretch). ValueError (one line) when the run cannot
    go on with this job's data."""
    resume_settings.check_allow_keys(allow)
    if not config.data.path:
        raise ValueError("--continue-on needs the data to go on with")
    manifest = Manifest.load(config.data.path)
    state = check_continue(run_dir, config, manifest, allow)
    if state == "complete":
        return complete_stretch_message(run_dir, config), False
    return None, state == "continue"


def new_stretch_length(
    run_dir: Path, job: JobConfig, manifest: Manifest, steps: int | None, overrides: list[str]
) -> JobConfig:
    """The job of a new stretch (check_continue's "continue") going on with the run's own
    settings (config.toml): its train.steps counted the stretch before (a `--steps` given with
    it, or the first job's), so the new stretch trains train.epochs passes over its data unless
    this command gives --steps (or --set train.steps). A stretch begun on this data and stopped
    before its first checkpoint, begun again, keeps the count it was begun with (config.toml's),
    as a stretch resumed does."""
    if steps is not None or any(o.strip().startswith("train.steps") for o in overrides):
        return job
    run = run_state.read_run_dir(run_dir)
    fingerprints = (dataset_fingerprint(manifest), *older_fingerprints(manifest))
    if unsaved_stretch(read_stretches(run_dir), fingerprints[0], run.step, fingerprints[1:]):
        return job
    return job.with_changes(train=dataclasses.replace(job.train, steps=0))


def own_plan(run_dir: Path) -> str | None:
    """The plan file a run that goes on with its own settings (config.toml) trains with: its own
    copy, RUN/plan.json, of the plan it was given, the same from any directory and whatever became
    of the file it was given; None where it planned at start-up (it plans again). ValueError (one
    line) for an unreadable config.toml."""
    saved = load_job_config(Path(run_dir) / names.CONFIG)
    return str(Path(run_dir) / names.PLAN) if saved.sharding.plan else None


STRETCH_KEYS = ("data.path", *resume_settings.CONTINUATION_KEYS)
"""What every new stretch changes by going on: its data, and its length (counted per stretch)."""


def stretch_notice(run_dir: Path, config: JobConfig) -> str | None:
    """The line a new stretch says when it goes on with settings other than the run's
    (config.toml; None: none differ), as lifecycle.resume_notice says a resume's: the changes
    --allow-change accepted are never made without a word. Its data and length are no news, nor
    is the run's own copy of its plan (own_plan), which every stretch after a `--plan` uses."""
    saved_path, run = Path(run_dir) / names.CONFIG, run_state.read_run_dir(run_dir)
    if not saved_path.is_file() or run.step is None:
        return None
    own = str((Path(run_dir) / names.PLAN).resolve())
    changes = {
        k: v
        for k, v in resume_settings.setting_changes(load_job_config(saved_path), config).items()
        if k not in STRETCH_KEYS and (k, v[1]) != ("sharding.plan", own)
    }
    if not changes:
        return None
    shown = resume_settings.changes_text(changes)
    return f"{run_dir}: going on from step {run.step:,} with changed settings: {shown}"


def complete_stretch_message(run_dir: Path, config: JobConfig) -> str:
    """What `--continue-on` with the data of the run's finished current stretch says."""
    step = run_state.read_run_dir(run_dir).step or 0
    return (
        f"{run_dir} has trained on {config.data.path} (to step {step:,}); nothing to do. Go on "
        "with other data (--continue-on DATA), or raise --steps to train longer on this one"
    )
