"""Id maps: raw ids -> rows, admission after K sightings, eviction by policy and age, the same map
at any number of ranks, and a resume mid-window that assigns every later id as the uninterrupted
run does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardrec.dataloader.format.raw_ids import MISSING_KEY
from shardrec.embeddings.managed.id_map import combine
from shardrec.embeddings.managed.maps import ManagedMaps, build_maps
from shardrec.embeddings.managed.table_kinds import TableSettings
from shardrec.trainer.job.config import load_job_config


def _keys(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.uint64)


def _maps(**settings) -> ManagedMaps:
    maps = build_maps({"f": ("t_f", TableSettings(**{"kind": "managed", **settings}))})
    maps.begin_stretch(0, 1000)
    return maps


def _step(maps: ManagedMaps, step: int, keys: np.ndarray) -> np.ndarray:
    for table in maps.due(step):
        maps.update(table, combine([table.idmap.pending()]), step)
    return maps.rows("f", keys, np.ones(len(keys), bool), step)


def test_an_id_gets_its_own_row_after_k_sightings_and_missing_is_row_0() -> None:
    maps = _maps(rows=4, admit_after=2, evict_every=1)
    assert _step(maps, 0, _keys(7, MISSING_KEY)).tolist() == [1, 0]  # not yet admitted: row 1
    assert _step(maps, 1, _keys(7, 9)).tolist() == [1, 1]  # seen once before the update at 1
    rows = _step(maps, 2, _keys(7, 9, 9))
    assert rows[0] >= 2 and rows[1] == 1 and rows[2] == 1  # 7 seen twice: a slot; 9 once
    assert _step(maps, 3, _keys(9, 7)).tolist() == [rows[0] + 1 if rows[0] == 2 else 2, rows[0]]


def test_lru_evicts_the_id_seen_longest_ago_and_age_frees_unseen_ids() -> None:
    maps = _maps(rows=2, admit_after=1, evict_every=1)
    _step(maps, 0, _keys(1, 2))
    assert sorted(_step(maps, 1, _keys(1, 2)).tolist()) == [2, 3]
    _step(maps, 2, _keys(1, 3))  # 3 waits; 2 is now the least recently seen
    rows = _step(maps, 3, _keys(1, 2, 3))
    assert rows[0] >= 2 and rows[1] == 1 and rows[2] >= 2
    aged = _maps(rows=2, admit_after=1, evict_every=1, policy="age", max_age="2 steps")
    _step(aged, 0, _keys(1, 2))
    _step(aged, 1, _keys(1))
    _step(aged, 2, _keys(1))
    assert _step(aged, 3, _keys(1, 2)).tolist()[1] == 1  # 2 unseen since step 0: freed


def test_lfu_keeps_frequent_ids_against_a_newcomer_seen_as_often() -> None:
    maps = _maps(rows=1, admit_after=1, evict_every=1, policy="lfu")
    _step(maps, 0, _keys(5, 5, 5))
    assert _step(maps, 1, _keys(6)).tolist() == [1]
    assert _step(maps, 2, _keys(6, 6)).tolist() == [1, 1]  # 6 seen twice < 5's 3: no swap
    _step(maps, 3, _keys(6, 6))
    assert _step(maps, 4, _keys(6, 5)).tolist() == [2, 1]  # 6's 5 sightings beat 5's 3


def _stream(steps: int, batch: int) -> list[np.ndarray]:
    g = np.random.default_rng(0)
    out = []
    for step in range(steps):
        ids = (g.zipf(1.3, batch) + 2 * step).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        ids[g.random(batch) < 0.05] = np.uint64(MISSING_KEY)
        out.append(ids)
    return out


def _run(world: int, settings: TableSettings, stream, start: int = 0, maps=None):
    """Rows of every batch from `start`, each rank remapping its slice; the maps at the end."""
    ranks = maps or [_one(settings) for _ in range(world)]
    rows = []
    for step in range(start, len(stream)):
        if ranks[0].due(step):
            pending = combine([m.tables["f"].idmap.pending() for m in ranks])
            for m in ranks:
                m.update(m.tables["f"], pending, step)
        parts = np.array_split(stream[step], world)
        rows.append(
            np.concatenate(
                [m.rows("f", p, np.ones(len(p), bool), step) for m, p in zip(ranks, parts)]
            )
        )
    return rows, ranks


def _one(settings: TableSettings) -> ManagedMaps:
    maps = build_maps({"f": ("t_f", settings)})
    maps.begin_stretch(0, 120)
    return maps


@pytest.mark.parametrize(
    "settings",
    [
        TableSettings(kind="managed", rows=48, evict_every=5),
        TableSettings(kind="managed", rows=48, evict_every=4, policy="lfu", max_age="30 steps"),
        TableSettings(kind="managed", rows=48, evict_every=5, policy="age", max_age="10 steps"),
        TableSettings(kind="unbounded", rows=300, evict_every=7),
    ],
    ids=["lru", "lfu-age", "age", "unbounded"],
)
def test_the_map_and_every_row_are_the_same_on_1_2_and_4_ranks(settings: TableSettings) -> None:
    stream = _stream(120, 64)
    runs = [_run(world, settings, stream) for world in (1, 2, 4)]
    digests = {r[1][0].tables["f"].idmap.digest() for r in runs}
    assert len(digests) == 1
    for a, b, c in zip(*(r[0] for r in runs)):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    admitted = runs[0][1][0].tables["f"].idmap.used
    assert admitted > 0 and (np.concatenate(runs[0][0]) >= 2).mean() > 0.05


def test_a_map_saved_mid_window_on_2_ranks_resumes_on_4_as_if_never_stopped() -> None:
    settings = TableSettings(kind="managed", rows=48, evict_every=5)
    stream = _stream(80, 64)
    whole, _ = _run(2, settings, stream)
    first, ranks = _run(2, settings, stream[:37])
    saved = combine([m.tables["f"].idmap.pending() for m in ranks])  # what a checkpoint holds
    resumed = [_one(settings) for _ in range(4)]
    for r, m in enumerate(resumed):
        src, dst = ranks[0].tables["f"].idmap, m.tables["f"].idmap
        for name in ("slot_key", "slot_count", "slot_last", "slot_born"):
            getattr(dst, name)[:] = getattr(src, name)
        dst.cand_key, dst.cand_count, dst.cand_last = src.cand_key, src.cand_count, src.cand_last
        dst.rebuild_index()
        if r == 0:
            dst.set_pending(saved)
    later, _ = _run(4, settings, stream, start=37, maps=resumed)
    assert all(np.array_equal(a, b) for a, b in zip(whole[37:], later))


def test_hashed_rows_stay_in_the_table() -> None:
    maps = build_maps({"f": ("t_f", TableSettings(kind="hashed", rows=5))})
    keys = np.concatenate([_keys(MISSING_KEY), np.arange(1, 200, dtype=np.uint64)])
    rows = maps.rows("f", keys, None, 0)
    assert rows[0] == 0 and rows[1:].min() >= 2 and rows[1:].max() <= 6
    assert len(set(rows[1:].tolist())) == 5


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("tables.C3.rows=0", r"tables\.C3\.rows = 0: a managed table needs at least 1 slot"),
        ("tables.C3.policy='mru'", r"tables\.C3\.policy = 'mru' is not one of lru, lfu, age"),
        # a typo is named with what was meant, beside the list (before: the list alone)
        ("tables.C3.policy='lfru'", r"'lfru' is not one of lru, lfu, age; did you mean lru\?$"),
        (
            "tables.C3.kind='manged'",
            r"kind = 'manged' is not one of static, managed, hashed, unbounded; "
            r"did you mean managed\?$",
        ),
        ("tables.C3.max_age='2 weeks'", r"tables\.C3\.max_age = '2 weeks': expected"),
        ("tables.C3.max_age='3 steps'", r"tables\.C3\.max_age = '3 steps' is below"),
        ("tables.C3.admit_after=0", r"tables\.C3\.admit_after = 0: must be >= 1"),
        ("tables.C3.candidates=0.0", r"tables\.C3\.candidates = 0\.0: must lie in"),
        ("tables.C3.rowz=3", r"unknown key tables\.C3\.rowz; did you mean tables\.C3\.rows\?"),
    ],
)
def test_a_bad_managed_table_setting_is_refused_in_one_line_naming_the_key(
    override: str, message: str
) -> None:
    base = ["tables.C3.kind='managed'", "tables.C3.rows=10", "tables.C3.evict_every=5"]
    with pytest.raises(ValueError, match=message) as err:
        load_job_config(None, [*base, override])
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("lines", "where", "message"),
    [
        (['kind = "manged"'], 2, "tables.\"*\".kind = 'manged' is not one of"),
        (['kind = "managed"', "rows = 10", 'policy = "lfru"'], 4, 'tables."*".policy'),
    ],
)
def test_a_bad_table_setting_in_a_job_file_names_its_line(
    tmp_path: Path, lines: list[str], where: int, message: str
) -> None:
    # `[tables."*"]`'s quoted key was not read for lines: the refusal said `job.toml: ` alone.
    job = tmp_path / "job.toml"
    job.write_text("\n".join(['[tables."*"]', *lines]) + "\n")
    with pytest.raises(ValueError) as err:
        load_job_config(job)
    assert str(err.value).startswith(f"{job}:{where}: {message}"), str(err.value)


def test_row_budgets_hold_99_percent_of_the_admitted_ids_lookups_and_share_short_memory() -> None:
    from shardrec.embeddings.managed.row_budget import CountCurve, propose_rows

    # 1,000 ids seen once, 100 seen 10 times, 10 seen 1,000 times (11,000 + ... lookups).
    curve = CountCurve.from_stats(
        [[1, 1, 1000, 1000], [10, 10, 100, 1000], [1000, 1000, 10, 10000]]
    )
    assert curve.seen(2).rows_for(0.99) == 10 + 89  # 99% of 11,000: the 10 hot ids and 89 more
    (p,) = propose_rows({"a": curve}, {"a": 2}, {"a": 100.0}, 1e9)
    assert (p.wanted, p.rows, p.distinct) == (109, 109, 1110)
    assert p.kept == pytest.approx((10_000 + 99 * 10) / 12_000)
    other = CountCurve.from_stats([[1, 1, 10, 10], [5, 5, 2000, 10000]])
    short = propose_rows(
        {"a": curve, "b": other}, {"a": 2, "b": 2}, {"a": 100.0, "b": 100.0}, 50_000
    )
    rows = {q.feature: q.rows for q in short}
    assert rows == {"a": 109, "b": 391}  # the best lookups per byte first, 500 rows of 100 B
    assert sum(rows.values()) * 100 <= 50_000


def test_a_managed_table_behind_an_hbm_cache_is_refused_naming_the_key() -> None:
    from shardrec.trainer.loop.managed_ids import check_managed_kernels

    tables = {
        "C3": TableSettings(kind="managed", rows=10),
        "C4": TableSettings(kind="hashed", rows=9),
    }
    check_managed_kernels(tables, {"t_C3": "fused", "t_C4": "fused_uvm_caching"})
    with pytest.raises(
        ValueError, match=r"^tables\.C3: the plan puts this managed table on fused_uvm_caching"
    ):
        check_managed_kernels(tables, {"t_C3": "fused_uvm_caching"})
