"""A managed table's `decay`: at a new day's first update (a stretch of a run that goes on) every
slot's and waiting id's count is shifted right, once a day, also across a resume from a
checkpoint taken at the day's start or after it."""

from __future__ import annotations

import numpy as np
import pytest

from shardrec.dataloader.format.raw_ids import MISSING_KEY
from shardrec.embeddings.managed.id_map import combine
from shardrec.embeddings.managed.maps import ManagedMaps, build_maps
from shardrec.embeddings.managed.table_kinds import TableSettings
from shardrec.trainer.job.config import load_job_config
from shardrec.trainer.rundir.id_map_state import IdMapsState

DAY = 40
"""Steps of each day (stretch) of the stream."""


def _maps(settings: TableSettings) -> ManagedMaps:
    maps = build_maps({"f": ("t_f", settings)})
    maps.begin_stretch(0, DAY)
    return maps


def _train(maps: ManagedMaps, step: int, keys: np.ndarray) -> np.ndarray:
    for table in maps.due(step):
        maps.update(table, combine([table.idmap.pending()]), step)
    return maps.rows("f", keys, np.ones(len(keys), bool), step)


def _keys(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.uint64)


def test_counts_shift_right_at_a_new_days_first_update_only() -> None:
    maps = _maps(
        TableSettings(kind="managed", rows=1, admit_after=1, evict_every=1, policy="lfu", decay=2)
    )
    m = maps.tables["f"].idmap
    _train(maps, 0, _keys(*[5] * 8, *[6] * 4))
    _train(maps, 1, _keys())  # 5 holds the slot (8 sightings), 6 waits (4)
    assert (m.slot_count[0], m.cand_count.tolist()) == (8, [4])
    _train(maps, 2, _keys())  # a later update of the same day: no decay
    assert (m.slot_count[0], m.cand_count.tolist()) == (8, [4])
    maps.begin_stretch(3, DAY)  # day 2
    _train(maps, 3, _keys(7, 7, 7))
    assert (m.slot_count[0], m.cand_count.tolist()) == (2, [1])  # 8 >> 2, 4 >> 2
    _train(maps, 4, _keys())  # 7 (3 sightings today) takes the slot of 5 (8 yesterday, now 2)
    _train(maps, 5, _keys())  # the day's later updates leave the counts as they are
    assert (m.slot_count[0], m.cand_count.tolist()) == (3, [1])  # 5 evicted, 6 waits
    assert _train(maps, 6, _keys(7, 5)).tolist() == [2, 1]


def test_without_decay_yesterdays_counts_keep_the_slot() -> None:
    maps = _maps(TableSettings(kind="managed", rows=1, admit_after=1, evict_every=1, policy="lfu"))
    _train(maps, 0, _keys(*[5] * 8))
    maps.begin_stretch(3, DAY)
    _train(maps, 3, _keys(7, 7, 7))
    assert _train(maps, 4, _keys(7, 5)).tolist() == [1, 2]


def _stream(steps: int, batch: int) -> list[np.ndarray]:
    g = np.random.default_rng(0)
    out = []
    for step in range(steps):
        ids = (g.zipf(1.3, batch) + step).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        ids[g.random(batch) < 0.05] = np.uint64(MISSING_KEY)
        out.append(ids)
    return out


SETTINGS = TableSettings(kind="managed", rows=24, evict_every=7, policy="lfu", decay=3)


def _days(maps: ManagedMaps, stream: list[np.ndarray], start: int) -> list[np.ndarray]:
    """Rows of every batch from `start`; a new day begins at every multiple of DAY."""
    rows = []
    for step in range(start, len(stream)):
        if step % DAY == 0 and step > maps.stretches.start:
            maps.begin_stretch(step, DAY)  # what `--continue-on` does after loading
        rows.append(_train(maps, step, stream[step]))
    return rows


def _resumed(saved: dict) -> ManagedMaps:
    maps = _maps(SETTINGS)
    IdMapsState(maps, None, keeps_pending=True).load_state_dict(saved)
    return maps


@pytest.mark.parametrize("stop", [DAY, DAY + 1, DAY + 7, 2 * DAY + 3])
def test_a_resume_at_or_after_a_days_start_decays_once_as_the_run_that_went_on(stop: int) -> None:
    stream = _stream(3 * DAY, 48)
    whole = _maps(SETTINGS)
    rows = _days(whole, stream, 0)
    first = _maps(SETTINGS)
    _days(first, stream[:stop], 0)  # killed after step `stop - 1`: its checkpoint is at `stop`
    saved = IdMapsState(first, None, keeps_pending=True).state_dict()
    later = _resumed(saved)
    again = _days(later, stream, stop)
    assert len(again) == len(rows) - stop
    assert all(np.array_equal(a, b) for a, b in zip(rows[stop:], again))
    assert later.tables["f"].idmap.digest() == whole.tables["f"].idmap.digest()
    undecayed = _maps(TableSettings(kind="managed", rows=24, evict_every=7, policy="lfu"))
    _days(undecayed, stream, 0)
    assert undecayed.tables["f"].idmap.digest() != whole.tables["f"].idmap.digest()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('{kind="managed", rows=10, decay=-1}', r"tables\.C3\.decay = -1: must lie in 0\.\.62"),
        (
            '{kind="unbounded", rows=10, decay=3}',
            r"tables\.C3\.decay = 3: a table of kind 'unbounded'",
        ),
        ('{kind="hashed", rows=10, decay=3}', r"tables\.C3\.decay = 3: a table of kind 'hashed'"),
        ("{decay=1}", r"tables\.C3\.decay = 1: a table of kind 'static'"),
    ],
)
def test_decay_is_refused_where_no_counts_decide_naming_the_key(table: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        load_job_config(None, [f"tables.C3={table}"])
    assert "\n" not in str(err.value)
