"""A day whose data lacks a feature the run trained on, or adds one: `train --continue-on`, `eval
--data` and `predict` name the feature in one line (a lacking one read as a dump of preprocessing
settings and an added one as a tuple of the schema's entries or two lists of cardinalities),
checked before any rank starts; a day of other
table rows is told how to make them the run's. A run given a job file to go on with keeps its own
plan unless that file names one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import write_tiny_dataset
from helpers import assert_one_line_error, jobs_handed_to_ranks
from typer.testing import CliRunner

from shardrec.dataloader.format.manifest import Manifest
from shardrec.tools.cli.app import app
from shardrec.trainer.inference.eval_request import run_dataset
from shardrec.trainer.job.config import load_job_config
from shardrec.trainer.rundir.life.trained_data import dataset_record

FOUR = (50, 300, 7, 1000)


def _run(tmp_path: Path, trained: Path, *settings: str) -> Path:
    """A run directory trained on `trained` with `settings` (--set items), complete at step 4
    (what the checks read)."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step-00000004").mkdir(parents=True)
    (run / "checkpoints" / "step-00000004" / "digests.json").write_text('{"files": {}}')
    config = load_job_config(None, [f'data.path="{trained}"', "train.steps=4", *settings])
    (run / "config.toml").write_text(config.to_toml())
    (run / "summary.json").write_text(json.dumps({"steps": 4}))
    (run / "dataset.json").write_bytes(dataset_record(str(trained), Manifest.load(trained)))
    return run


@pytest.mark.parametrize(
    ("trained", "new", "where"),
    [(FOUR, FOUR[:3], "missing here, but in"), (FOUR[:3], FOUR, "not in")],
    ids=["lacks", "adds"],
)
def test_a_day_that_lacks_or_adds_a_feature_is_refused_naming_it(tmp_path, trained, new, where):
    write_tiny_dataset(tmp_path / "day0", cardinalities=trained)
    write_tiny_dataset(tmp_path / "day1", cardinalities=new, seed=1)
    run = _run(tmp_path, tmp_path / "day0")
    day1 = tmp_path / "day1"
    feature = f"feature f3: {where} the data {run} trained on"
    goes_on = CliRunner().invoke(app, ["train", "--out-dir", str(run), "--continue-on", str(day1)])
    assert_one_line_error(goes_on, f"^error: {feature}; a run goes on with data of its features$")
    # eval's and export's check of --data (after the run's plan, which this run dir has not)
    with pytest.raises(ValueError) as caught:
        run_dataset(run, load_job_config(run / "config.toml"), day1)
    assert str(caught.value) == f"--data {day1}: {feature}"


def test_predict_on_a_day_that_adds_a_feature_names_it(tmp_path):
    # It said "cardinalities: [50, 300, 7, 1000] in training, [50, 300, 7, 1000, 20] here".
    from shardrec.trainer.inference.file_header import feature_transform
    from shardrec.trainer.inference.predict import check_preprocessing
    from shardrec.trainer.job.sections import DataConfig

    trained = write_tiny_dataset(tmp_path / "day0")
    five = tmp_path / "five"
    write_tiny_dataset(five, cardinalities=(*FOUR, 20), seed=1)
    header = {  # what `export` writes of the data the model trained on
        "feature_names": [f.name for f in trained.sparse_features],
        "multi_hot": [],
        "dense_features": list(trained.dense_features),
        "transform": feature_transform(trained, tmp_path / "day0", DataConfig()),
    }
    with pytest.raises(ValueError) as caught:
        check_preprocessing(header, Manifest.load(five), five)
    assert str(caught.value) == (
        f"{five}: feature f4: not in the data the model trained on; preprocess it with the "
        "training data's settings"
    )


@pytest.mark.parametrize("trained_dense", [[], ["d0", "d1", "d2", "d3", "d4"]])
def test_predict_on_other_dense_features_names_both_lists(tmp_path, trained_dense):
    # A model without dense features read "dense features d0, ... (4), the model reads , ... (0)".
    from shardrec.trainer.inference.file_header import feature_transform
    from shardrec.trainer.inference.predict import check_preprocessing
    from shardrec.trainer.job.sections import DataConfig

    day = write_tiny_dataset(tmp_path / "day")
    header = {
        "feature_names": [f.name for f in day.sparse_features],
        "multi_hot": [],
        "dense_features": trained_dense,
        "transform": feature_transform(day, tmp_path / "day", DataConfig()),
    }
    with pytest.raises(ValueError) as caught:
        check_preprocessing(header, Manifest.load(tmp_path / "day"), tmp_path / "day")
    reads = "none" if not trained_dense else "d0, d1, d2, ... (5)"
    here = ", ".join(day.dense_features[:3]) + f", ... ({len(day.dense_features)})"
    assert len(day.dense_features) == 4
    assert str(caught.value) == (
        f"{tmp_path / 'day'}: dense features {here}, the model reads "
        f"{reads}; score data preprocessed with the spec the model's training data was, or raw rows"
    )


def test_a_spec_days_other_table_rows_are_refused_naming_the_spec_not_max_ids(tmp_path):
    # A spec's tables are its columns' hash_size: --max-ids, which such data never takes, was the
    # advice given.
    for day, cardinalities in (("day0", FOUR), ("day1", (*FOUR[:3], 999))):
        manifest = write_tiny_dataset(tmp_path / day, cardinalities=cardinalities)
        manifest.options["spec_sha256"] = "ab" * 32  # as `preprocess --spec` records it
        manifest.save(tmp_path / day)
    run = _run(tmp_path, tmp_path / "day0")
    day1 = tmp_path / "day1"
    goes_on = CliRunner().invoke(app, ["train", "--out-dir", str(run), "--continue-on", str(day1)])
    assert_one_line_error(
        goes_on,
        f"^error: feature f3: 999 rows here, 1,000 rows in the data {run} trained on: preprocess "
        r"the new data as the old \(the same spec and --raw-ids\)$",
    )


def _inferred_days(tmp_path: Path, raw: tuple[str, ...], kinds=("integer", "integer")) -> Path:
    """day0 and day1 of one spec inferred again from each day: f1's hash_size 6000, then 9900
    (its kind as `kinds` give it); f1 raw ids where `raw` names it."""
    for seed, (day, hash_size, kind) in enumerate(zip(("day0", "day1"), (6000, 9900), kinds)):
        manifest = write_tiny_dataset(tmp_path / day, raw=raw, seed=seed)
        spec = {
            "format": {"kind": "parquet"},
            "columns": [
                {"role": "label", "name": "click"},
                {"role": "categorical", "name": "f0", "kind": "integer", "hash_size": 50},
                {"role": "categorical", "name": "f1", "kind": kind, "hash_size": hash_size},
                {"role": "categorical", "name": "f2", "kind": "integer", "hash_size": 7},
                {"role": "categorical", "name": "f3", "kind": "integer", "hash_size": 1000},
            ],
        }
        sizes = [50, hash_size, 7, 1000]
        manifest.options.update(spec=spec, spec_sha256=day * 8, max_ids=sizes)
        manifest.options.update(raw_ids=list(raw)) if raw else None
        manifest.save(tmp_path / day)
    managed = ['tables."*"={kind="managed", rows=100}'] if raw else []
    return _run(tmp_path, tmp_path / "day0", "train.global_batch_size=64", *managed)


def test_a_day_of_a_spec_inferred_again_is_refused_naming_its_column_and_the_runs_spec(tmp_path):
    # A spec inferred again from the next day proposes other hash sizes; going on said only
    # "max_ids[1]: 6000 in training, 9900 here, spec_sha256: '...' in training, '...' here", with
    # no word of which column differs or how to make the day as the run's. A hashed column's
    # hash_size is its table's rows: f1's rows are 300 on both days here, as the checks see them.
    run = _inferred_days(tmp_path, raw=())
    day1 = tmp_path / "day1"
    goes_on = CliRunner().invoke(app, ["train", "--out-dir", str(run), "--continue-on", str(day1)])
    assert_one_line_error(
        goes_on,
        rf"^error: the new data was preprocessed otherwise than the data {run} trained on: "
        r"max_ids\[1\]: 6000 in training, 9900 here, spec column 'f1': hash_size: 6000 in "
        r"training, 9900 here; preprocess the new data as the old \(the same spec and --raw-ids; "
        rf"`shardrec spec show {tmp_path / 'day0'}` prints it\)$",
    )


def test_the_runs_spec_is_shown_from_the_run_once_its_day_is_gone(tmp_path):
    # With day0's folder removed, the refusal still said "`shardrec spec show .../day0` prints
    # it", a command that fails ("no manifest.json"). The run keeps its data's spec in
    # RUN/dataset.json: the refusal names the run, and `spec show RUN` prints that spec.
    run = _inferred_days(tmp_path, raw=())
    shutil.rmtree(tmp_path / "day0")
    day1 = tmp_path / "day1"
    goes_on = CliRunner().invoke(app, ["train", "--out-dir", str(run), "--continue-on", str(day1)])
    assert_one_line_error(
        goes_on,
        r"; preprocess the new data as the old \(the same spec and --raw-ids; "
        rf"`shardrec spec show {run}` prints it\)$",
    )
    shown = CliRunner().invoke(app, ["spec", "show", str(run)])
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.startswith(f"# The spec of the data {run} trained on last ({tmp_path}")
    assert 'name = "f1"\nrole = "categorical"\nkind = "integer"\nhash_size = 6000' in shown.stdout
    # a directory that is neither a dataset nor a run: the dataset's error, as before
    assert_one_line_error(CliRunner().invoke(app, ["spec", "show", str(tmp_path)]), "manifest")


@pytest.mark.parametrize("trained_day", ["kept", "removed"])
def test_a_day_whose_raw_id_column_has_another_hash_size_goes_on(
    tmp_path, monkeypatch, trained_day
):
    # A raw-id column is never hashed: its hash_size (which `spec infer` proposes anew from each
    # day) changes no byte of the data, yet the day was refused: "max_ids[1]: 6000 in training,
    # 9900 here, spec column 'f1': hash_size: 6000 in training, 9900 here; preprocess the new
    # data as the old ...", or with the day trained on removed, "spec_sha256: 'day0day0...' in
    # training, 'day1day1...' here".
    run = _inferred_days(tmp_path, raw=("f1",))
    if trained_day == "removed":
        shutil.rmtree(tmp_path / "day0")
    handed = jobs_handed_to_ranks(monkeypatch)
    day1 = tmp_path / "day1"
    CliRunner().invoke(app, ["train", "--out-dir", str(run), "--continue-on", str(day1)])
    assert [j.data.path for j in handed] == [str(day1)]


def test_a_raw_id_column_of_another_kind_is_named_not_its_hash_size(tmp_path):
    # Its kind makes its ids (an integer's own value, a string's hash): that difference is named.
    run = _inferred_days(tmp_path, raw=("f1",), kinds=("integer", "string"))
    day1 = tmp_path / "day1"
    goes_on = CliRunner().invoke(app, ["train", "--out-dir", str(run), "--continue-on", str(day1)])
    assert_one_line_error(
        goes_on,
        rf"^error: the new data was preprocessed otherwise than the data {run} trained on: "
        r"spec column 'f1': kind: 'integer' in training, 'string' here; preprocess the new data "
        r"as the old \(the same spec and --raw-ids; "
        rf"`shardrec spec show {tmp_path / 'day0'}` prints it\)$",
    )


def test_a_run_going_on_with_a_job_file_keeps_its_own_plan(tmp_path, monkeypatch):
    # `--continue-on DAY --config job.toml` had planned at start-up, announcing
    # "changed settings: sharding.plan: '.../plan.json' -> ''", and every later stretch with it.
    write_tiny_dataset(tmp_path / "day0")
    write_tiny_dataset(tmp_path / "day1", seed=1)
    job = tmp_path / "job.toml"
    job.write_text('[train]\ndevice = "cpu"\nglobal_batch_size = 64\n')
    own = tmp_path / "run" / "plan.json"
    run = _run(
        tmp_path,
        tmp_path / "day0",
        'train.device="cpu"',
        "train.global_batch_size=64",
        f'sharding.plan="{tmp_path / "given.json"}"',
    )
    planned = CliRunner().invoke(
        app,
        ["plan", "--data", str(tmp_path / "day0"), "--config", str(job), "--world-size", "1"]
        + ["--out", str(own)],
    )
    assert planned.exit_code == 0, planned.output
    handed = jobs_handed_to_ranks(monkeypatch)
    goes_on = ["train", "--out-dir", str(run), "--continue-on", str(tmp_path / "day1")]
    for given in (["--config", str(job)], ["--config", str(job), "--set", 'sharding.plan=""']):
        CliRunner().invoke(app, [*goes_on, *given])
    assert [j.sharding.plan for j in handed] == [str(own), ""]
