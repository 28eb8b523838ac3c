"""What a resume may change: `--allow-change KEY` lets exactly that setting (or, for a section
name, that section's settings) differ from the run's config.toml, and nothing that merely starts
with the same letters."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import write_tiny_dataset

from shardrec.dataloader.format.manifest import Manifest
from shardrec.trainer.job.config import JobConfig, load_job_config
from shardrec.trainer.rundir.life import continuation
from shardrec.trainer.rundir.life.lifecycle import check_run_dir, resume_notice
from shardrec.trainer.rundir.life.resume_settings import check_allow_keys
from shardrec.trainer.rundir.life.trained_data import dataset_record


def _run_with_a_checkpoint(tmp_path: Path, config_toml: str) -> Path:
    run = tmp_path / "run"
    step = run / "checkpoints" / "step-00000004"
    step.mkdir(parents=True)
    (step / "digests.json").write_text("{}")  # what makes a checkpoint complete
    (run / "config.toml").write_text(config_toml)
    return run


def test_allowing_a_key_does_not_allow_keys_that_start_with_it(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    saved = load_job_config(None, [f'data.path="{tiny_dataset}"', "train.global_batch_size=64"])
    run = _run_with_a_checkpoint(tmp_path, saved.to_toml())
    manifest = Manifest.load(tiny_dataset)
    changed = dataclasses.replace(saved, optim=dataclasses.replace(saved.optim, sparse_lr=0.1))
    refused = r"changed settings \(optim.sparse_lr: 0.05 -> 0.1\); accept them with --allow-change optim.sparse_lr,"
    with pytest.raises(ValueError, match=refused):
        check_run_dir(run, changed, manifest, ["optim.sparse"])
    with pytest.raises(ValueError, match=refused):
        check_run_dir(run, changed, manifest, ["opt"])
    assert check_run_dir(run, changed, manifest, ["optim.sparse_lr"]) == "resume"
    assert check_run_dir(run, changed, manifest, ["optim"]) == "resume"  # the whole section
    assert check_run_dir(run, saved, manifest, []) == "resume"


def test_a_rerun_with_the_same_data_given_relative_announces_no_change(
    tiny_dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """config.toml keeps data.path absolute; the same command rerun from the same directory with
    `--data data` announced "changed settings: data.path: '/abs/data' -> 'data'"."""
    saved = load_job_config(
        None, [f'data.path="{tiny_dataset.resolve()}"', "train.global_batch_size=64"]
    )
    run = _run_with_a_checkpoint(tmp_path, saved.to_toml())
    monkeypatch.chdir(tiny_dataset.parent)
    rerun = load_job_config(
        None, [f'data.path="{tiny_dataset.name}"', "train.global_batch_size=64"]
    )
    assert check_run_dir(run, rerun, Manifest.load(tiny_dataset), []) == "resume"
    assert resume_notice(run, rerun) is None
    moved = load_job_config(None, ['data.path="elsewhere"', "train.global_batch_size=64"])
    assert resume_notice(run, moved) == (
        f"{run}: resuming from step 4 with changed settings: data.path: "
        f"{str(tiny_dataset.resolve())!r} -> {str(tiny_dataset.parent.resolve() / 'elsewhere')!r}"
    )


@pytest.mark.parametrize(
    "change",
    [
        "train.log_interval=5",
        "checkpoint.interval_steps=2",
        "checkpoint.keep=3",
        "checkpoint.timeout_s=60",
        "checkpoint.stop_grace_s=5",
        "dist.timeout_s=900",
        "data.num_workers=0",
        "data.multihot_cache='/tmp/index-tables'",
    ],
)
def test_a_change_that_alters_no_result_resumes_without_allow_change(
    tiny_dataset: Path, tmp_path: Path, change: str
) -> None:
    """Logging, checkpointing, timeouts, the loader's threads and the folder of the multi-hot index
    tables change no weight or metric (a resume is exact from any step, batches come in order, the
    tables are drawn alike anywhere): a resume refused them ("resuming with changed settings
    (train.log_interval: 20 -> 5); accept them with --allow-change ...").
    Now it resumes and says the change; a change that alters results is still refused."""
    job = [f'data.path="{tiny_dataset}"', "train.global_batch_size=64"]
    run = _run_with_a_checkpoint(tmp_path, load_job_config(None, job).to_toml())
    changed = load_job_config(None, [*job, change])
    assert check_run_dir(run, changed, Manifest.load(tiny_dataset), []) == "resume"
    key, value = change.split("=")
    assert resume_notice(run, changed).endswith(f" -> {value}")
    assert f"changed settings: {key}: " in resume_notice(run, changed)
    faster = load_job_config(None, [*job, change, "optim.dense_lr=0.1"])
    with pytest.raises(ValueError, match=r"\(optim.dense_lr: 0.05 -> 0.1\); accept them"):
        check_run_dir(run, faster, Manifest.load(tiny_dataset), [])


_GROWING = ('tables."*"={kind="managed", rows=100, admit_after=2}', "train.global_batch_size=64")


def _growing_run(
    tiny_dataset: Path, tmp_path: Path, change: str
) -> tuple[Path, Manifest, JobConfig]:
    """A run of managed tables with a checkpoint, its dataset, and its config with `change`."""
    saved = load_job_config(None, [f'data.path="{tiny_dataset}"', *_GROWING])
    run = _run_with_a_checkpoint(tmp_path, saved.to_toml())
    changed = load_job_config(None, [f'data.path="{tiny_dataset}"', *_GROWING, change])
    return run, Manifest.load(tiny_dataset), changed


def test_a_changed_table_setting_is_named_by_its_key_and_accepted_by_it(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    run, manifest, lfu = _growing_run(tiny_dataset, tmp_path, 'tables."*".policy="lfu"')
    with pytest.raises(ValueError) as caught:
        check_run_dir(run, lfu, manifest, [])
    assert str(caught.value) == (
        f"{run}: resuming with changed settings (tables.\"*\".policy: 'lru' -> 'lfu'); accept "
        "them with --allow-change 'tables.\"*\".policy', or start over with --restart"
    )
    for key in ('tables."*".policy', "tables.*.policy", 'tables."*"', "tables"):
        check_allow_keys([key])
        assert check_run_dir(run, lfu, manifest, [key]) == "resume", key
    with pytest.raises(ValueError, match=r"tables.\"\*\".policy"):
        check_run_dir(run, lfu, manifest, ["tables.C1", "tables.*.admit_after"])
    with pytest.raises(ValueError) as caught:
        check_allow_keys(['tables."*".polcy'])
    assert str(caught.value) == (
        '--allow-change tables."*".polcy: no such setting; did you mean tables."*".policy?'
    )


def test_a_change_of_the_data_stream_is_refused_even_when_allowed(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    """train.seed, the global batch, shuffle and tail make the stream a resume goes on in the
    middle of. Allowed, they passed here, and the ranks refused the checkpoint's loader state
    once it loaded: 'training failed: rank 0: loader state has seed=0 but this loader has 5: not
    the same stream; the newest complete checkpoint, ... is kept and a re-run resumes from it'."""
    settings = [f'data.path="{tiny_dataset}"', "train.global_batch_size=64", "train.seed=0"]
    saved = load_job_config(None, settings)
    run = _run_with_a_checkpoint(tmp_path, saved.to_toml())
    manifest = Manifest.load(tiny_dataset)
    for train, data, shown in (
        ({"seed": 5}, {}, "train.seed: 0 -> 5"),
        ({"global_batch_size": 32}, {}, "train.global_batch_size: 64 -> 32"),
        (
            {},
            {"shuffle": False, "tail": "pad"},
            "data.shuffle: true -> false, data.tail: 'drop' -> 'pad'",
        ),
        # Allowed, the ranks refused it: 'loader state has num_samples=... but this loader has
        # ...: not the same stream' (a click log's and an event log's alike).
        ({}, {"train_split": "val"}, "data.train_split: 'train' -> 'val'"),
    ):
        changed = dataclasses.replace(
            saved,
            train=dataclasses.replace(saved.train, **train),
            data=dataclasses.replace(saved.data, **data),
        )
        with pytest.raises(ValueError) as refused:
            check_run_dir(run, changed, manifest, ["train", "data"])
        it = "them" if len(train) + len(data) > 1 else "it"
        assert str(refused.value) == (
            f"{run}: {shown}: the run's data stream, which a resume goes on in the middle of; set "
            f"{it} back, or start a new run (--restart, or another --out-dir)"
        )


def test_a_changed_table_size_or_kind_is_refused_outright(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    run, manifest, bigger = _growing_run(tiny_dataset, tmp_path, 'tables."*".rows=200')
    with pytest.raises(ValueError) as caught:
        check_run_dir(run, bigger, manifest, ["tables"])
    assert str(caught.value) == (
        f"{run}: tables.\"*\".rows: 100 -> 200: a table's kind and rows are the run's for good "
        "(its checkpoints hold the table and its id map); set it back, or start a new run "
        "(--restart, or another --out-dir)"
    )


def test_going_on_with_a_changed_table_policy_names_the_key_that_accepts_it(
    tmp_path: Path,
) -> None:
    days = [tmp_path / f"day{d}" for d in (0, 1)]
    for d, day in enumerate(days):
        write_tiny_dataset(day, raw=("f1", "f3"), day=d)
    run = tmp_path / "run"
    (run / "checkpoints" / "step-00000004").mkdir(parents=True)
    (run / "checkpoints" / "step-00000004" / "digests.json").write_text("{}")
    saved = load_job_config(None, [f'data.path="{days[0]}"', "train.steps=4", *_GROWING])
    (run / "config.toml").write_text(saved.to_toml())
    (run / "summary.json").write_text(json.dumps({"steps": 4}))
    (run / "dataset.json").write_bytes(dataset_record(str(days[0]), Manifest.load(days[0])))
    lfu = load_job_config(
        None, [f'data.path="{days[1]}"', "train.steps=4", *_GROWING, 'tables."*".policy="lfu"']
    )
    with pytest.raises(ValueError) as caught:
        continuation.check_continuing_job(run, lfu, [])
    assert str(caught.value) == (
        f"{run}: going on with changed settings (tables.\"*\".policy: 'lru' -> 'lfu'); accept "
        "them with --allow-change 'tables.\"*\".policy'"
    )
    assert continuation.check_continuing_job(run, lfu, ['tables."*".policy']) == (None, True)
    fewer = load_job_config(
        None, [f'data.path="{days[1]}"', "train.steps=4", *_GROWING, 'tables."*".rows=50']
    )
    with pytest.raises(ValueError, match=r'tables."\*".rows: 100 -> 50: a table\'s kind and rows'):
        continuation.check_continuing_job(run, fewer, ["tables"])


def test_a_new_stretch_names_the_settings_it_goes_on_with_changed(tmp_path: Path) -> None:
    """A new stretch accepted with --allow-change said nothing of the change (a resume names it):
    now one line, as a resume's; its data, its length and the run's own plan are no change."""
    days = [tmp_path / f"day{d}" for d in (0, 1)]
    saved = load_job_config(None, [f'data.path="{days[0]}"', "train.steps=4", *_GROWING])
    run = _run_with_a_checkpoint(tmp_path, saved.to_toml())
    plan = f'sharding.plan="{run / "plan.json"}"'
    going_on = [f'data.path="{days[1]}"', "train.steps=0", *_GROWING, plan]
    assert continuation.stretch_notice(run, load_job_config(None, going_on)) is None
    lfu = load_job_config(None, [*going_on, 'tables."*".policy="lfu"', "optim.sparse_lr=0.1"])
    assert continuation.stretch_notice(run, lfu) == (
        f"{run}: going on from step 4 with changed settings: optim.sparse_lr: 0.05 -> 0.1, "
        "tables.\"*\".policy: 'lru' -> 'lfu'"
    )
