"""Raw events scored by an event-log model whose ids have no row of its tables (a later log's new
item): one line naming the file's row, the column, the value, the model's range and what to do.
Before, an item was "row 5: item_id: 64 is not an item the model knows (64 items)", and nothing
to do was said (a user past the model's is said so: tests/e2e/test_sequence_flow.py)."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import EVENT_SPEC

from shardrec.tools.synth.yambda import write_yambda_like


def test_an_item_past_the_models_items_is_named_with_what_to_do(tmp_path) -> None:
    from shardrec.dataloader.spec.event_spec import load_event_spec
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
