"""Event-log datasets and the temporal loader: histories gathered causally, crosses hashed as the
reference hashes them, windows in time order, the same stream at any world size, a resume in the
middle of a window bit for bit, and the held-out last window."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from shardrec.dataloader.digest import batch_digest
from shardrec.dataloader.event_loader import build_event_loader
from shardrec.dataloader.events.history_kernels import (
    LIKE,
    LISTEN_PLUS,
    SKIP,
    gather_histories,
    xxh64_rows,
)

SPEC = """
[format]
kind = "parquet"

[items.artist]
file = "artist_item_mapping.parquet"
value = "artist_id"

[items.album]
file = "album_item_mapping.parquet"
value = "album_id"

[history]
length = 24
min_history = 8

[[crosses]]
name = "user_x_artist"
keys = ["uid", "artist"]
size = 1009

[[crosses]]
name = "item_x_hour"
keys = ["item", "hour"]
size = 997

[split]
window_seconds = 86400
"""


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> Path:
    """A Yambda-like log of ~20,000 listens over 30 days, preprocessed."""
    from shardrec.dataloader.spec.event_spec_file import load_event_spec
    from shardrec.tools.preprocess.events.event_dataset import build_event_dataset
    from shardrec.tools.synth.yambda import write_yambda_like

    raw = tmp_path_factory.mktemp("raw")
    write_yambda_like(raw, 20_000, seed=3)
    (raw / "spec.toml").write_text(SPEC)
    out = tmp_path_factory.mktemp("events")
    build_event_dataset(
        [raw / "events.parquet"], load_event_spec(raw / "spec.toml"), raw / "spec.toml", out
    )
    return out


def test_crosses_hash_as_the_xxhash_package_does():
    """xxh64 (seed 0) of little-endian int64 keys, as xxhash.xxh64(struct.pack('<q...')) gives
    (values computed with the xxhash package 4.1.0)."""
    cases = [
        ([0], 3803688792395291579),
        ([1], 11468921228449061269),
        ([123456789], 14662639848940634189),
        ([7, 3], 11592955229346901256),
        ([42, 17, 5], 16110537521024145792),
        ([1000000, 99, 23], 2860019535783131547),
    ]
    for keys, digest in cases:
        for size in (100_000_000, 997):
            out = np.empty(1, np.uint64)
            xxh64_rows(np.array([keys], np.int64), 0, size, out)
            assert int(out[0]) == digest % size, keys


def _history_by_hand(action, first, anchor, scan, per_pool, last_n):
    lo = max(first, anchor - scan)
    kept = []
    if last_n:
        pooled = [j for j in range(lo, anchor) if action[j]]
        return pooled[-last_n:]
    for bit in (LISTEN_PLUS, LIKE, SKIP):
        kept += [j for j in range(lo, anchor) if action[j] == bit][-per_pool:]
    return sorted(kept)


@pytest.mark.parametrize("last_n", [0, 5])
def test_history_keeps_the_last_of_each_pool_before_the_anchor_in_time_order(last_n):
    rng = np.random.default_rng(0)
    action = rng.choice(
        np.array([0, LISTEN_PLUS, LIKE, SKIP], np.uint8), 400, p=[0.1, 0.5, 0.1, 0.3]
    )
    first = np.array([0, 0, 100, 100, 250])
    anchor = np.array([0, 60, 101, 240, 399])
    pos = np.zeros((5, 12), np.int64)
    lengths = np.zeros(5, np.int64)
    gather_histories(anchor, first, action, 40, 4, last_n, pos, lengths)
    for i in range(5):
        expect = _history_by_hand(action, first[i], anchor[i], 40, 4, last_n)
        assert pos[i, : lengths[i]].tolist() == expect


def _digests(loaders, batches):
    names = loaders[0].feature_names
    return [batch_digest([loader.batch(k) for loader in loaders], names) for k in batches]


def test_the_stream_is_the_same_at_1_2_and_4_ranks(events):
    streams = []
    for world in (1, 2, 4):
        loaders = [
            build_event_loader(events, "train", global_batch_size=64, rank=r, world_size=world)
            for r in range(world)
        ]
        streams.append(_digests(loaders, range(0, len(loaders[0]), 7)))
    assert streams[0] == streams[1] == streams[2]
    assert len(set(streams[0])) == len(streams[0])  # the batches differ from each other


def test_batches_follow_the_windows_and_histories_come_before_their_anchor(events):
    loader = build_event_loader(events, "train", global_batch_size=64, rank=0, world_size=1)
    windows = [loader.window_of(k) for k in range(len(loader))]
    assert windows == sorted(windows) and len(set(windows)) > 5
    source = loader.source
    for k in (0, len(loader) // 2, len(loader) - 1):
        rows, _ = loader._epoch_order().batch(k)
        batch = loader.batch(k)
        jt = batch.sparse_features.to_dict()
        ts, lengths = jt["hist_ts"].values().numpy(), jt["hist_ts"].lengths().numpy()
        part, user, place = (a[rows] for a in source.timeline)
        anchor_ts = np.array(
            [
                source.parts[p].ts[source.parts[p].offsets[u] + e]
                for p, u, e in zip(part, user, place)
            ]
        )
        ends = np.cumsum(lengths)
        for i, (lo, hi) in enumerate(zip(ends - lengths, ends)):
            assert (np.diff(ts[lo:hi]) >= 0).all() and (ts[lo:hi] <= anchor_ts[i]).all()
        days = (anchor_ts - source.info.t_min) // 86400
        assert (days == loader.window_of(k)).all()


def test_resume_in_the_middle_of_a_window_continues_bit_for_bit_at_another_world_size(events):
    def loader(rank, world):
        return build_event_loader(
            events, "train", global_batch_size=64, rank=rank, world_size=world, shuffle=True, seed=7
        )

    first = loader(0, 1)
    k = next(k for k in range(1, len(first)) if first.window_of(k) == first.window_of(k - 1))
    stream = iter(first)
    for _ in range(k):
        next(stream)
    state = first.state_dict()
    expect = [batch_digest([next(stream)], first.feature_names) for _ in range(3)]
    resumed = [loader(r, 2) for r in range(2)]
    for r in resumed:
        r.load_state_dict(state)
    iters = [iter(r) for r in resumed]
    got = [batch_digest([next(i) for i in iters], first.feature_names) for _ in range(3)]
    assert got == expect
    other_seed = build_event_loader(
        events, "train", global_batch_size=64, rank=0, world_size=1, seed=8
    )
    with pytest.raises(ValueError, match="loader state has seed=7 but this loader has 8"):
        other_seed.load_state_dict(state)


def test_shuffle_mixes_anchors_within_their_window_only(events):
    plain = build_event_loader(events, "train", global_batch_size=64, rank=0, world_size=1)
    mixed = build_event_loader(
        events, "train", global_batch_size=64, rank=0, world_size=1, shuffle=True, seed=1
    )
    assert [plain.window_of(k) for k in range(len(plain))] == [
        mixed.window_of(k) for k in range(len(mixed))
    ]
    w = plain.window_of(0)
    ks = [k for k in range(len(plain)) if plain.window_of(k) == w]
    in_window = {tuple(plain._epoch_order().batch(k)[0]) for k in ks}
    assert _digests([plain], ks) != _digests([mixed], ks)
    rows_plain = np.sort(np.concatenate([plain._epoch_order().batch(k)[0] for k in ks]))
    rows_mixed = np.sort(np.concatenate([mixed._epoch_order().batch(k)[0] for k in ks]))
    assert len(in_window) == len(ks)
    # Dropped tails differ, but every shuffled anchor comes from the same window.
    lo, hi = mixed.spec.window_offsets[0], mixed.spec.window_offsets[1]
    assert rows_mixed.min() >= lo and rows_mixed.max() < hi and rows_plain.max() < hi


def test_the_held_out_last_window_is_the_val_split_and_pads_its_tail(events):
    train = build_event_loader(events, "train", global_batch_size=64, rank=0, world_size=1)
    val = build_event_loader(events, "val", global_batch_size=64, rank=0, world_size=1, tail="pad")
    assert val.window_of(0) == train.window_of(len(train) - 1) + 1
    labels = np.concatenate([val.batch(k).labels.numpy() for k in range(len(val))])
    assert (labels >= 0).sum() == val.num_samples and (labels < 0).sum() == len(
        labels
    ) - val.num_samples


def test_an_anchor_outside_its_users_events_is_one_line_not_an_index_error(events):
    """A timeline that disagrees with its parts (a changed byte) is refused naming the dataset
    and the anchor, before anything is indexed by it."""
    from shardrec.dataloader.events.event_batches import EventBatcher, EventSource
    from shardrec.dataloader.format.manifest import DatasetError

    source = EventSource(events, "train")
    batcher = EventBatcher.of(source)
    good = tuple(np.asarray(c[:4]) for c in source.timeline)
    assert batcher.make(good).labels.shape == (4,)
    users = len(source.parts[0].offsets) - 1
    for part, user, event in ((0, users + 7, 0), (0, 0, 10**9), (len(source.parts), 0, 0)):
        bad = tuple(np.array([*g[:3], v]) for g, v in zip(good, (part, user, event)))
        with pytest.raises(DatasetError) as e:
            batcher.make(bad)
        assert str(e.value) == (
            f"{events} (train): a timeline anchor (part {part}, user {user}, event {event}) lies "
            "outside the users' events: a file disagrees with its manifest; `shardrec data "
            "verify` names it"
        )


def test_a_user_of_more_events_than_two_parts_leaves_no_empty_part_and_the_same_stream(
    tmp_path, monkeypatch
):
    """Parts are cut every EVENTS_PER_PART events at a user's start; a user holding more than two
    parts' worth had left a part number with no user, and preprocessing ended in an IndexError."""
    from shardrec.dataloader.spec.event_spec_file import load_event_spec
    from shardrec.tools.preprocess.events import event_dataset
    from shardrec.tools.synth.yambda import write_yambda_like

    write_yambda_like(tmp_path, 3_000, seed=5)
    (tmp_path / "spec.toml").write_text(SPEC)
    spec = load_event_spec(tmp_path / "spec.toml")
    inputs = [tmp_path / "events.parquet"]
    event_dataset.build_event_dataset(inputs, spec, tmp_path / "spec.toml", tmp_path / "one")
    monkeypatch.setattr(event_dataset, "EVENTS_PER_PART", 16)
    many = event_dataset.build_event_dataset(
        inputs, spec, tmp_path / "spec.toml", tmp_path / "many"
    )
    assert len(many.events["parts"]) > 2
    streams = []
    for out in ("one", "many"):
        loader = build_event_loader(
            tmp_path / out, "train", global_batch_size=32, rank=0, world_size=1
        )
        streams.append(_digests([loader], range(len(loader))))
    assert streams[0] == streams[1]


def _column_values(data: np.ndarray, path: Path, column: str, dtype=np.uint32) -> np.ndarray:
    """The values of a column of `dtype` (a list column's elements) of the Arrow file `path`, as
    a view into `data`, the file's bytes."""
    import pyarrow as pa

    with pa.memory_map(str(path)) as f:
        whole = f.read_buffer()
        f.seek(0)
        array = pa.ipc.open_file(f).get_batch(0).column(column)
        values = (array.values if hasattr(array, "values") else array).buffers()[1]
        at, size = values.address - whole.address, values.size
        del whole, array, values
    return data[at : at + size].view(dtype)


@pytest.mark.parametrize("where", ["at", "in the history of"])
def test_an_item_past_the_item_maps_is_one_line_not_an_index_error(events, tmp_path, where):
    """A changed byte of a part's item column: `data digest` (and the loader, so train) ended in
    numpy's IndexError from the item maps; it is one line naming the dataset and the anchor."""
    import shutil

    from helpers import assert_one_line_error
    from typer.testing import CliRunner

    from shardrec.dataloader.events.event_batches import EventSource
    from shardrec.tools.cli.app import app

    data = tmp_path / "data"
    shutil.copytree(events, data)
    source = EventSource(data, "train")
    part, user, event = (int(c[0]) for c in source.timeline)
    first = int(source.parts[part].offsets[user])
    items = len(source.artist)
    path = data / source.info.parts[part].name
    del source
    changed = np.frombuffer(bytearray(path.read_bytes()), np.uint8)
    ids = _column_values(changed, path, "item")
    if where == "at":
        ids[first + event] = 1 << 28
    else:
        ids[first : first + event] = 1 << 28  # every event before the first anchor
    path.write_bytes(changed.tobytes())
    line = (
        f"{data} (train): item {1 << 28} {where} the anchor (part {part}, user {user}, "
        f"event {event}) is outside the item maps' {items} items: a file disagrees with its "
        "manifest; `shardrec data verify` names it"
    )
    result = CliRunner().invoke(
        app, ["data", "digest", str(data), "--global-batch", "64", "--batches", "1", "--no-shuffle"]
    )
    assert_one_line_error(result, re.escape(line))


@pytest.mark.parametrize(
    "edit, problem",
    [
        (
            lambda e, s: e["windows"]["train"].__setitem__(-1, e["windows"]["train"][-1] + 500),
            r"windows\.train ends at \d+, but train/timeline\.arrow holds \d+ anchors",
        ),
        (
            lambda e, s: e["windows"]["train"].__setitem__(2, 0),
            r"windows\.train is \[0, \d+, 0, .*expected timeline rows in order from 0",
        ),
        (
            lambda e, s: s["train"].update(rows=s["train"]["rows"] + 5),
            r"splits\.train\.rows is \d+, but train/timeline\.arrow holds \d+ anchors",
        ),
    ],
    ids=["windows-past-the-timeline", "windows-out-of-order", "split-rows"],
)
def test_windows_that_do_not_cut_the_timeline_are_refused_in_one_line(
    events, tmp_path, edit, problem
):
    """A hand-edited events block: windows past the timeline ended digest (and the loader) in
    an IndexError; windows out of order, or a split's count other than its timeline's (train
    sizes its epochs by it), were read silently as another stream."""
    import json
    import shutil

    from helpers import assert_one_line_error
    from typer.testing import CliRunner

    from shardrec.tools.cli.app import app

    data = tmp_path / "data"
    shutil.copytree(events, data)
    raw = json.loads((data / "manifest.json").read_text())
    edit(raw["events"], raw["splits"])
    (data / "manifest.json").write_text(json.dumps(raw))
    line = (
        f"{re.escape(str(data / 'manifest.json'))}: malformed events: {problem}; re-run the "
        "command that made the dataset, into it, to write its manifest again"
    )
    for command in (["digest", "--global-batch", "64", "--batches", "1"], ["verify"], ["stats"]):
        result = CliRunner().invoke(app, ["data", command[0], str(data), *command[1:]])
        assert_one_line_error(result, line)


def _digest_refuses_a_changed_column(events, tmp_path, name, column, change, line, dtype=np.uint32):
    """`data digest` of a copy of `events` whose file `name` has `change(values)` applied to the
    values of `column` (`line(path, values)`: the one line it must refuse in)."""
    import shutil

    from helpers import assert_one_line_error
    from typer.testing import CliRunner

    from shardrec.tools.cli.app import app

    data = tmp_path / "data"
    shutil.copytree(events, data)
    path = data / name
    changed = np.frombuffer(bytearray(path.read_bytes()), np.uint8)
    values = _column_values(changed, path, column, dtype)
    change(values)
    path.write_bytes(changed.tobytes())
    result = CliRunner().invoke(app, ["data", "digest", str(data), "--global-batch", "64"])
    assert_one_line_error(result, re.escape(line(path, values)))


@pytest.mark.parametrize(
    "file, column, table", [("part", "uid", "uid"), ("items", "artist", "artist")]
)
def test_a_user_or_artist_past_its_table_is_one_line_naming_the_file(
    events, tmp_path, file, column, table
):
    """A changed byte of a part's uid or an item map's artist: the loader made batches of it
    (digest exit 0) and training stopped in fbgemm's 'RuntimeError: Expected idx < num_rows',
    naming no file. Opening the split refuses it in one line naming file, column, row and id."""
    from shardrec.dataloader.format.manifest import Manifest

    manifest = Manifest.load(events)
    rows = {f.table or f.name: f.cardinality for f in manifest.sparse_features}[table]

    def past_the_table(values: np.ndarray) -> None:
        values[3] = rows

    _digest_refuses_a_changed_column(
        events,
        tmp_path,
        "events/part-00000.arrow" if file == "part" else "items.arrow",
        column,
        past_the_table,
        lambda path, _: (
            f"{path}: column {column}, row 3 has id {rows}, outside table {table} of {rows} rows "
            "(the file disagrees with its manifest; `shardrec data verify` names it)"
        ),
    )


def test_an_action_that_is_no_action_code_is_one_line_naming_the_file(events, tmp_path):
    """A changed byte of a part's action column: the listen trained as a skip (its label is
    whether its action is listen-plus) and the event left every history's pools, without a word
    (`dlrmv4` trained to its end). Opening the split refuses it in one line."""

    def no_code(actions: np.ndarray) -> None:
        actions[5] |= 0x40

    _digest_refuses_a_changed_column(
        events,
        tmp_path,
        "events/part-00000.arrow",
        "action",
        no_code,
        lambda path, actions: (
            f"{path}: column action, row 5 holds {int(actions[5])}, no action code (0, 1, 2, 4): "
            "the file disagrees with its manifest; `shardrec data verify` names it"
        ),
        np.uint8,
    )
