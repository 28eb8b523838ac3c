"""Raw events scored by an event-log model whose ids have no row of its tables (a later log's new
item): one line naming the file's row, the column, the value, the model's range and what to do.
Before, an item was "row 5: item_id: 64 is not an item the model knows (64 items)", and nothing
to do was said (a user past the model's is said so: tests/e2e/test_sequence_flow.py). A dataset
made from a log of more users is named by its table, with what scores it."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import EVENT_SPEC, cli

from shardrec.tools.synth.yambda import write_yambda_like


def test_an_item_past_the_models_items_is_named_with_what_to_do(tmp_path) -> None:
    from shardrec.dataloader.spec.event_spec_file import load_event_spec
    from shardrec.tools.preprocess.events.event_columns import EventLogError
    from shardrec.tools.preprocess.events.raw_events import event_row_batches

    write_yambda_like(tmp_path, 3_000, seed=1)
    spec = tmp_path / "spec.toml"
    spec.write_text('[format]\nkind = "parquet"\n' + EVENT_SPEC)
    log = pq.read_table(tmp_path / "events.parquet")
    items = log["item_id"].to_numpy().copy()
    known = int(items.max())  # the model's maps: items 0 .. known - 1
    items[17] = known
    path = tmp_path / "new_item.parquet"
    pq.write_table(log.set_column(1, "item_id", pa.array(items, pa.uint32())), path)
    header = {"transform": {"events_spec": load_event_spec(spec).to_dict()}}
    maps = (np.zeros(known, np.int64), np.zeros(known, np.int64))
    with pytest.raises(EventLogError) as caught:
        event_row_batches(header, maps, path)
    first = int(np.flatnonzero(items >= known)[0])
    assert re.fullmatch(
        rf"{re.escape(str(path))}: row {first}: item_id: {known} is beyond the model's "
        rf"{known:,} items \(0 to {known - 1:,}\), which each have a row of its item table: leave "
        "that item's events out, or score them with a model trained on item maps that hold it",
        str(caught.value),
    )


def test_a_dataset_of_another_logs_users_names_the_table_and_the_raw_events(tmp_path) -> None:
    # Before: "data: preprocessed with other settings than the model's training data
    # (cardinalities[0]: 48 in training, 80 here); preprocess it with the training data's
    # settings", which no setting does: the uid table is as large as the log's users.
    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.trainer.inference.file_header import describe_model
    from shardrec.trainer.inference.predict import check_preprocessing
    from shardrec.trainer.job.config import load_job_config

    for name, rows in (("trained", 3_000), ("other", 6_000)):
        write_yambda_like(tmp_path / name, rows, seed=1)
        (tmp_path / name / "spec.toml").write_text('[format]\nkind = "parquet"\n' + EVENT_SPEC)
        cli("preprocess", tmp_path / name / "events.parquet", "--events",
            tmp_path / name / "spec.toml", "--out", tmp_path / f"{name}_data")  # fmt: skip
    trained, other = (Manifest.load(tmp_path / f"{n}_data") for n in ("trained", "other"))
    users = [m.feature("uid").cardinality for m in (trained, other)]
    assert users[0] < users[1]
    job = load_job_config(None, ['model.arch="hstu"', f'data.path="{tmp_path / "trained_data"}"'])
    with pytest.raises(ValueError) as caught:
        check_preprocessing(describe_model(job, trained), other, tmp_path / "other_data")
    assert str(caught.value) == (
        f"{tmp_path / 'other_data'}: feature uid: {users[1]:,} rows here, {users[0]:,} rows in the "
        "data the model trained on; an event log's tables are as large as its users and items: "
        "score the raw events it was made from, which the model reads by its own tables"
    )
