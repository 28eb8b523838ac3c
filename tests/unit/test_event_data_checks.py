"""Whether other event-log data is the data a run or a model may score or go on with
(trainer/rundir, trainer/inference/eval_request.py): a later period of the same log is; data whose
tables differ, or whose samples an other event spec made, is refused in one line."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from helpers import EVENT_SPEC

from shardrec.dataloader.format.fingerprints import dataset_fingerprint, older_fingerprints
from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.spec.event_spec_file import load_event_spec
from shardrec.tools.preprocess.events.event_dataset import build_event_dataset
from shardrec.tools.synth.yambda import write_yambda_like
from shardrec.trainer.inference.eval_request import run_dataset
from shardrec.trainer.job.config import load_job_config
from shardrec.trainer.rundir.checkpoint.signature import checkpoint_signature, describe_mismatch
from shardrec.trainer.rundir.life import continuation, lifecycle, trained_data
from shardrec.trainer.rundir.life.stretches import (
    Stretch,
    read_stretches,
    unsaved_stretch,
    write_stretches,
)
from shardrec.trainer.rundir.life.trained_data import dataset_record

DAY = 86400


def _dataset(raw: Path, log: Path, out: Path, extra: str = "") -> Path:
    spec = raw / f"spec-{out.name}.toml"
    spec.write_text(EVENT_SPEC + extra)
    build_event_dataset([log], load_event_spec(spec), spec, out)
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """The dataset of a log, of the same log a day later, of it with another event spec, and of
    other events with the same spec and sizes."""
    raw = tmp_path_factory.mktemp("raw")
    write_yambda_like(raw, 3_000, seed=1)
    log = raw / "events.parquet"
    table = pq.read_table(log)
    later = raw / "later.parquet"
    column = table.schema.get_field_index("timestamp")
    shifted = pc.add(table["timestamp"], pa.scalar(DAY, table["timestamp"].type))
    pq.write_table(table.set_column(column, "timestamp", shifted), later)
    # Other plays of the same listens: a listen-plus becomes a skip and back, so the same
    # users, items, anchors and spec make other events, of the same sizes.
    replayed = raw / "replayed.parquet"
    column = table.schema.get_field_index("played_ratio_pct")
    flipped = pc.subtract(pa.scalar(100, pa.int32()), table["played_ratio_pct"].cast(pa.int32()))
    flipped = flipped.cast(table["played_ratio_pct"].type)
    pq.write_table(table.set_column(column, "played_ratio_pct", flipped), replayed)
    return {
        "trained": _dataset(raw, log, raw / "trained"),
        "later": _dataset(raw, later, raw / "later"),
        "label60": _dataset(raw, log, raw / "label60", "[label]\nplayed_ratio_min = 60"),
        "replayed": _dataset(raw, replayed, raw / "replayed"),
    }


def _run(tmp_path: Path, trained: Path, complete: bool = True) -> Path:
    """A run directory trained on `trained`, its stretch complete at step 4."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step-00000004").mkdir(parents=True)
    (run / "checkpoints" / "step-00000004" / "digests.json").write_text("{}")
    config = load_job_config(None, [f'data.path="{trained}"', "train.steps=4"])
    (run / "config.toml").write_text(config.to_toml())
    if complete:
        (run / "summary.json").write_text(json.dumps({"steps": 4}))
    (run / "dataset.json").write_bytes(dataset_record(str(trained), Manifest.load(trained)))
    return run


@pytest.mark.parametrize("recorded", ["now", "before"])
def test_a_later_period_of_the_same_log_is_evaluated_and_continued_on(data, tmp_path, recorded):
    run = _run(tmp_path, data["trained"])
    if recorded == "before":  # its largest timestamp + 1 as a table size, no event settings
        record = json.loads((run / "dataset.json").read_text())
        cards = [f.cardinality for f in Manifest.load(data["trained"]).sparse_features]
        record["preprocessing"] = {
            k: v for k, v in record["preprocessing"].items() if not k.startswith("[")
        } | {"cardinalities": cards}
        for entry, card in zip(record["schema"]["sparse"], cards):
            entry[1] = card
        (run / "dataset.json").write_text(json.dumps(record))
    config = load_job_config(run / "config.toml")
    assert run_dataset(run, config, data["later"]).splits.keys() == {"train", "val"}
    later = load_job_config(None, [f'data.path="{data["later"]}"', "train.steps=4"])
    assert continuation.check_continue(run, later, Manifest.load(data["later"]), []) == "continue"


def test_a_log_of_more_users_is_refused_as_other_tables(data, tmp_path):
    run = _run(tmp_path, data["trained"])
    manifest = Manifest.load(data["later"])
    uid = manifest.feature("uid")
    uid.cardinality += 1
    more = tmp_path / "more"
    more.mkdir()
    manifest.save(more)
    config = load_job_config(run / "config.toml")
    with pytest.raises(ValueError) as caught:
        run_dataset(run, config, more)
    assert str(caught.value) == (
        f"--data {more}: feature uid: {uid.cardinality:,} rows here, {uid.cardinality - 1:,} rows "
        f"in the data {run} trained on"
    )
    later = load_job_config(None, [f'data.path="{more}"', "train.steps=4"])
    with pytest.raises(ValueError) as caught:
        continuation.check_continue(run, later, manifest, [])
    assert str(caught.value) == (
        f"feature uid: {uid.cardinality:,} rows here, {uid.cardinality - 1:,} rows in the data "
        f"{run} trained on: an event log's tables have a row for each id up to its largest "
        "(users, items, artists, albums), and a run's tables keep their rows; go on with a log of "
        "the same ids"
    )


def test_data_an_other_event_spec_made_is_refused_naming_the_setting(data, tmp_path):
    run = _run(tmp_path, data["trained"])
    config = load_job_config(run / "config.toml")
    with pytest.raises(ValueError) as caught:
        run_dataset(run, config, data["label60"])
    assert str(caught.value) == (
        f"--data {data['label60']}: preprocessed with other settings than the data {run} trained "
        "on ([label] played_ratio_min: 50.0 in training, 60.0 here); preprocess it with the "
        "training data's settings"
    )


def _old_fingerprint(directory: Path, spec: bool = False) -> str:
    """The fingerprint a run recorded of an event-log dataset before it covered the event spec:
    features, cardinalities and split rows only (as a click log's still is); with `spec`, the one
    recorded before it covered the event files (8221d76): that and the spec's sample settings."""
    m = Manifest.load(directory)
    content = {
        "dense": m.dense_features,
        "sparse": [(f.name, f.cardinality, f.multi_hot) for f in m.sparse_features],
        "splits": {
            name: [(p.name, p.rows, p.sha256) for p in split.parts]
            for name, split in sorted(m.splits.items())
        },
    }
    if spec:
        keys = ("played_ratio_min", "history", "crosses", "split")
        content["event_spec"] = {k: m.events["spec"].get(k) for k in keys}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _remade(
    tmp_path: Path, data: dict[str, Path], recorded: str = "now", by: str = "label60"
) -> tuple[Path, Path]:
    """A run trained on `trained` at DIR, then DIR remade as `by` (label60: by another spec, the
    same features, sizes and samples, other labels). `recorded`: the run's dataset.json as written
    now, or "before" the fingerprint covered the spec (with the spec's settings, as 3634e01 wrote
    it)."""
    path = tmp_path / "ev"
    shutil.copytree(data["trained"], path)
    run = _run(tmp_path, path)
    if recorded == "before":
        record = json.loads((run / "dataset.json").read_text())
        record["fingerprint"] = _old_fingerprint(path)
        (run / "dataset.json").write_text(json.dumps(record))
    shutil.rmtree(path)
    shutil.copytree(data[by], path)
    return run, path


@pytest.mark.parametrize("recorded", ["now", "before"])
def test_resuming_or_evaluating_on_data_remade_by_another_spec_is_refused_naming_it(
    data, tmp_path, recorded
):
    run, path = _remade(tmp_path, data, recorded)
    config = load_job_config(run / "config.toml")
    with pytest.raises(ValueError) as caught:
        lifecycle.check_run_dir(run, config, Manifest.load(path), [])
    assert str(caught.value) == (
        f"{run} was trained on data of another event spec than {path} now holds ([label] "
        "played_ratio_min: 50.0 in training, 60.0 here): a run cannot resume on a changed "
        f"dataset; preprocess the log into {path} again with the run's spec, start over with "
        "--restart or use another --out-dir"
    )
    # What `shardrec eval RUN` checks before it reads a checkpoint (its one line).
    with pytest.raises(ValueError) as caught:
        run_dataset(run, config, None)
    assert str(caught.value) == (
        f"{run} was trained on data of another event spec than {path} now holds ([label] "
        f"played_ratio_min: 50.0 in training, 60.0 here): preprocess the log into {path} again "
        "with the run's spec to evaluate the run"
    )


def test_resuming_or_evaluating_on_other_events_of_the_same_spec_and_sizes_is_refused(
    data, tmp_path
):
    run, path = _remade(tmp_path, data, by="replayed")
    trained, here = Manifest.load(data["trained"]), Manifest.load(path)
    # Alike in all that the fingerprint covered before it covered the event files.
    assert trained_data.preprocessing(here) == trained_data.preprocessing(trained)
    assert here.splits == trained.splits
    assert here.events["parts"] != trained.events["parts"]
    was, now = dataset_fingerprint(trained)[:12], dataset_fingerprint(here)[:12]
    config = load_job_config(run / "config.toml")
    with pytest.raises(ValueError) as caught:
        lifecycle.check_run_dir(run, config, here, [])
    assert str(caught.value) == (
        f"{run} was trained on other data ({path}, fingerprint {was}; this dataset's is {now}): "
        "a run cannot resume on a changed dataset; to train the run on it as new data (the next "
        f"day's), give --continue-on {path} in place of --data; or start over with --restart or "
        "use another --out-dir"
    )
    with pytest.raises(ValueError) as caught:
        run_dataset(run, config, None)
    assert str(caught.value) == (
        f"{run} was trained on other data than {path} now holds (fingerprint {was}; the data "
        f"there is {now}): to evaluate on this data all the same, pass --data {path}"
    )
    # Data the run has not seen: --continue-on goes on with it (it said "nothing to do").
    assert continuation.check_continue(run, config, here, []) == "continue"


@pytest.mark.parametrize(
    "covered, spec_settings", [("spec", True), ("nothing", True), ("nothing", False)]
)
def test_a_run_recorded_before_fingerprints_covered_the_events_still_resumes_and_evaluates(
    data, tmp_path, covered, spec_settings
):
    """Recorded before the fingerprint covered the event files (covering the spec), or before it
    covered the spec too."""
    trained = data["trained"]
    run = _run(tmp_path, trained)
    old = _old_fingerprint(trained, spec=covered == "spec")
    assert old != dataset_fingerprint(Manifest.load(trained))
    record = json.loads((run / "dataset.json").read_text())
    record["fingerprint"] = old
    if not spec_settings:  # recorded before 3634e01 too: no event-spec settings at all
        record["preprocessing"] = {
            k: v for k, v in record["preprocessing"].items() if not k.startswith("[")
        }
    (run / "dataset.json").write_text(json.dumps(record))
    config = load_job_config(run / "config.toml")
    assert lifecycle.check_run_dir(run, config, Manifest.load(trained), []) == "complete"
    assert run_dataset(run, config, None).kind == "events"
    # Its checkpoints' signatures hold the old fingerprint: the ranks and eval accept them.
    saved = checkpoint_signature(config.model, config.optim, [], old)
    m = Manifest.load(trained)
    now = checkpoint_signature(
        config.model, config.optim, [], dataset_fingerprint(m), older_fingerprints(m)
    )
    assert describe_mismatch(saved, now) == ""


@pytest.mark.parametrize("covered", ["spec", "nothing"])
def test_a_stretch_begun_before_and_stopped_before_its_checkpoint_begins_again(
    data, tmp_path, covered
):
    """A stretch on `later` begun by a shardrec whose fingerprint did not cover the event files
    (or the spec), stopped before its first checkpoint: going on with `later` again begins it
    again as a new stretch, not a resume of a stretch that saved nothing."""
    trained, later = data["trained"], data["later"]
    run = _run(tmp_path, trained)
    here = Manifest.load(later)
    old = _old_fingerprint(later, spec=covered == "spec")
    first = Stretch(0, str(trained), dataset_fingerprint(Manifest.load(trained)), 0, 4)
    write_stretches(run, [first, Stretch(1, str(later), old, 4)])
    # What rank 0 wrote once stretches.json listed the stretch: the run names its data.
    record = json.loads(dataset_record(str(later), here))
    (run / "dataset.json").write_text(json.dumps(record | {"fingerprint": old}))
    config = load_job_config(None, [f'data.path="{later}"', "train.steps=4"])
    (run / "config.toml").write_text(config.to_toml())
    # (None: train; True: as a new stretch), what `shardrec train` and the ranks act on; before,
    # (None, False): a resume, as if the stretch had a checkpoint of its own.
    assert continuation.check_continuing_job(run, config, []) == (None, True)
    stretches = read_stretches(run)
    new, older = dataset_fingerprint(here), older_fingerprints(here)
    assert unsaved_stretch(stretches, new, 4, older) == stretches[1]
    assert unsaved_stretch(stretches, new, 5, older) is None  # it saved step 5: not begun again


def test_a_click_logs_fingerprint_is_unchanged(tiny_dataset):
    # Only an event log's fingerprint covers its spec: a click log's is what it was.
    assert dataset_fingerprint(Manifest.load(tiny_dataset)) == _old_fingerprint(tiny_dataset)


def test_the_fingerprints_event_keys_are_the_ones_that_decide_samples(tmp_path):
    # manifest.py cannot import the spec (dataloader/format sits below dataloader/spec), so it
    # names the spec's sample keys itself: a key added to EventSpec.sample_settings and not there
    # would let data of another spec resume a run.
    from shardrec.dataloader.format.fingerprints import EVENT_SAMPLE_KEYS

    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(EVENT_SPEC)
    spec = load_event_spec(spec_file)
    sections = {"[label]": "played_ratio_min", "[history]": "history", "[split]": "split"}
    used = {
        "crosses" if key == "[[crosses]]" else sections[key.split()[0]]
        for key in spec.sample_settings()
    }
    assert used == set(EVENT_SAMPLE_KEYS)
    assert set(EVENT_SAMPLE_KEYS) <= set(spec.to_dict())
