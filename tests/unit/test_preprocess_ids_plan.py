"""Id mapping (hashing, vocabulary) and run planning (chunks, splits, inputs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardrec.tools.preprocess.ids.id_maps import (
    MISSING_ID,
    OOV_ID,
    Vocabulary,
    hash_ids,
    merge_counts,
)
from shardrec.tools.preprocess.inputs import (
    discover_inputs,
    halve,
    plan_tasks,
    resolve_layout,
    split_ranges,
)
from shardrec.tools.preprocess.tasks.task import SplitRange
from shardrec.tools.preprocess.text.lines import chunk_bounds, count_lines

# Known answers: a change to the mixing or the mod would remap every id of every dataset and
# silently invalidate every checkpoint trained on one. Computed once with the code as released.
GOLDEN_HEX = [
    "00000000",
    "00000001",
    "68fd1e64",
    "80e26c9b",
    "fb936136",
    "7b4723c4",
    "ffffffff",
    "ffffffffffffffff",
]
GOLDEN_IDS = {
    2: [1, 1, 1, 1, 1, 1, 1, 1],
    1000: [1, 374, 468, 28, 685, 295, 272, 664],
    10_000_000: [1, 7915964, 8663310, 8538013, 706006, 5943679, 964613, 7360045],
    2**40: [
        1,
        124828882940,
        285348094239,
        409837881484,
        334824798085,
        228093315712,
        38273940545,
        1086417046993,
    ],
}


@pytest.mark.parametrize("cardinality", sorted(GOLDEN_IDS))
def test_hash_ids_known_answers(cardinality: int):
    values = np.array([int(h, 16) for h in GOLDEN_HEX], dtype=np.uint64)
    assert (
        hash_ids(values, np.zeros(len(values), bool), cardinality).tolist()
        == GOLDEN_IDS[cardinality]
    )
    missing = np.arange(len(values)) % 2 == 0
    want = [0 if m else g for m, g in zip(missing, GOLDEN_IDS[cardinality])]
    assert hash_ids(values, missing, cardinality).tolist() == want


def test_hash_ids_range_missing_and_spread():
    values = np.arange(0, 5000, dtype=np.uint64) | np.uint64(0xFFFF0000)
    missing = np.zeros(len(values), dtype=bool)
    missing[::7] = True
    ids = hash_ids(values, missing, 1_000_000)
    assert (ids[missing] == MISSING_ID).all()
    assert ids[~missing].min() >= 1 and ids[~missing].max() < 1_000_000
    assert len(np.unique(ids[~missing])) > 0.99 * (~missing).sum()  # neighbours do not collide
    np.testing.assert_array_equal(ids, hash_ids(values, missing, 1_000_000))
    with pytest.raises(ValueError, match="at least 2"):
        hash_ids(values, missing, 1)


def test_merge_counts_sums_across_chunks():
    a = (np.array([1, 5, 9], np.uint64), np.array([2, 1, 1]))
    b = (np.array([5, 7], np.uint64), np.array([3, 4]))
    values, counts = merge_counts([a, b])
    assert values.tolist() == [1, 5, 7, 9] and counts.tolist() == [2, 4, 4, 1]


def test_vocabulary_orders_by_count_and_maps_the_rest_to_oov():
    vocab = Vocabulary.build(
        np.array([3, 8, 2**32 + 5, 11], np.uint64), np.array([5, 9, 5, 1]), min_count=2
    )
    assert vocab.cardinality == 5  # 3 kept + missing + OOV
    values = np.array([8, 3, 2**32 + 5, 11, 12, 0], np.uint64)
    missing = np.array([False, False, False, False, False, True])
    # 8 is the most frequent; 3 and 2^32+5 tie on count and are ordered by value.
    assert vocab.lookup(values, missing).tolist() == [2, 3, 4, OOV_ID, OOV_ID, MISSING_ID]
    empty = Vocabulary.build(np.array([1], np.uint64), np.array([1]), min_count=5)
    assert empty.lookup(np.array([1], np.uint64), np.array([False])).tolist() == [OOV_ID]


def test_chunk_bounds_cut_after_newlines_and_cover_the_file(tmp_path: Path):
    path = tmp_path / "t.txt"
    lines = [f"{i}\t{'x' * (i % 13)}\n".encode() for i in range(500)]
    path.write_bytes(b"".join(lines)[:-1])  # no newline at the very end
    bounds = chunk_bounds(path, 300, 0)
    assert bounds[0][0] == 0 and bounds[-1][1] == path.stat().st_size
    data = path.read_bytes()
    for (_s, e), (s2, _) in zip(bounds, bounds[1:]):
        assert e == s2 and data[e - 1 : e] == b"\n"
    assert count_lines(path, skip_header=False) == 500
    assert count_lines(path, skip_header=True) == 499


def test_kaggle_and_day_splits():
    ranges = split_ranges("kaggle", True, 700, "first")
    assert ranges == (
        SplitRange("train", 0, 600),
        SplitRange("val", 600, 650),
        SplitRange("test", 650, 700),
    )
    assert halve(0, 7, "first") == (SplitRange("val", 0, 4), SplitRange("test", 4, 7))
    assert halve(0, 7, "second") == (SplitRange("test", 0, 4), SplitRange("val", 4, 7))
    assert split_ranges("days", False, 100, "first") == ()  # a training day


def test_inputs_in_day_order_and_layouts(tmp_path: Path):
    for d in (0, 2, 10, 1):
        (tmp_path / f"day_{d}").write_text("1\n")
    (tmp_path / ".hidden").write_text("x")
    files = discover_inputs([tmp_path])
    assert [f.name for f in files] == ["day_0", "day_1", "day_2", "day_10"]
    assert resolve_layout("auto", files) == "days" and resolve_layout("auto", files[:1]) == "kaggle"
    with pytest.raises(ValueError, match="at least two day files"):
        resolve_layout("days", files[:1])
    with pytest.raises(ValueError, match="no such file"):
        discover_inputs([tmp_path / "nope"])


def test_plan_gives_each_task_its_first_line(tmp_path: Path):
    path = tmp_path / "train.txt"
    path.write_bytes(b"".join(f"{i % 2}\t{i}\n".encode() for i in range(1000)))
    tasks = plan_tasks([path], "kaggle", "first", 1000, header=False)
    assert len(tasks) > 5
    data = path.read_bytes()
    for t in tasks:
        assert t.first_line == data[: t.start].count(b"\n")
        assert t.split_of(t.first_line) == (
            "train" if t.first_line < 857 else "val" if t.first_line < 929 else "test"
        )


def test_only_tasks_with_training_lines_are_read_for_the_vocabulary(tmp_path: Path):
    # A task whose first line is past the last training line (Kaggle's seventh day, the last day
    # file) holds only val/test rows, which never enter a vocabulary: the counting pass skips it.
    path = tmp_path / "train.txt"
    path.write_bytes(b"".join(f"{i % 2}\t{i}\n".encode() for i in range(1000)))
    tasks = plan_tasks([path], "kaggle", "first", 400, header=False)
    assert [t.holds_train_lines for t in tasks] == [t.first_line < 857 for t in tasks]
    assert not all(t.holds_train_lines for t in tasks)
    days = [tmp_path / "day_0", tmp_path / "day_1"]
    for d in days:
        d.write_bytes(path.read_bytes())
    tasks = plan_tasks(days, "days", "first", 1 << 20, header=False)
    assert [(Path(t.path).name, t.holds_train_lines) for t in tasks] == [
        ("day_0", True),
        ("day_1", False),
    ]


def test_compiled_hashing_equals_hash_ids():
    from shardrec.tools.preprocess.parse import parse_kernel
    from shardrec.tools.preprocess.parts import column_kernels

    rng = np.random.default_rng(4)
    values = rng.integers(0, 2**63, (500, 3), dtype=np.int64).astype(np.uint64) * np.uint64(2)
    missing = rng.random((500, 3)) < 0.2
    cards = np.array([2, 1000, 2**33], dtype=np.int64)
    kernel = (
        column_kernels.hash_matrix if parse_kernel.AVAILABLE else column_kernels.hash_matrix.py_func
    )
    got = kernel(values, missing, cards)
    for f in range(3):
        np.testing.assert_array_equal(
            got[:, f], hash_ids(values[:, f], missing[:, f], int(cards[f]))
        )


@pytest.mark.parametrize("gz", [False, True])
def test_read_pieces_cut_at_newlines_and_keep_every_byte(tmp_path: Path, gz: bool):
    import gzip

    from shardrec.tools.preprocess.tasks.task import Task
    from shardrec.tools.preprocess.tasks.task_text import read_pieces

    text = (
        b"".join(b"x" * (i % 50) + b"\n" for i in range(400))
        + b"y" * 300
        + b"\n"
        + b"last line without newline"
    )
    path = tmp_path / ("t.txt.gz" if gz else "t.txt")
    path.write_bytes(gzip.compress(text) if gz else text)
    task = Task(0, str(path), 0, -1 if gz else len(text), 0, (), "train", False)
    pieces = [
        bytes(p) for p in read_pieces(task.text, piece_bytes=64)
    ]  # lines up to 300 bytes: the buffer grows
    assert all(p.endswith(b"\n") for p in pieces) and len(pieces) > 10
    assert b"".join(pieces) == text + b"\n"


def test_count_and_vocabulary_files_are_synced_before_they_appear(tmp_path: Path, monkeypatch):
    # A rerun trusts an existing count or vocabulary marker, so every file must be on disk before
    # its rename, and the marker renamed last. The events name what is synced: a directory's
    # fsync after one rename must not pass for the next file's own fsync.
    from helpers import record_syncs_and_renames

    from shardrec.tools.preprocess.ids.vocab import build_vocabularies, run_dirs
    from shardrec.tools.preprocess.parse.criteo_text import Schema
    from shardrec.tools.preprocess.parse.text_parser import TextParser
    from shardrec.tools.preprocess.tasks.task import Task, TaskOptions
    from shardrec.tools.preprocess.vocab_count import count_task

    def synced_before_renamed(events: list[str]) -> list[str]:
        """The renamed files whose temporary was not synced since the previous rename."""
        unsynced, since = [], 0
        for i, event in enumerate(events):
            if event.startswith("replace "):
                name = event.removeprefix("replace ")
                if not any(e.startswith(f"fsync .{name}.tmp-") for e in events[since:i]):
                    unsynced.append(name)
                since = i + 1
        return unsynced

    text = b"1\t3\t00c0ffee\n0\t4\t\n"
    (tmp_path / "in.txt").write_bytes(text)
    schema = Schema(num_dense=1, num_sparse=1)
    task = Task(0, str(tmp_path / "in.txt"), 0, len(text), 0, (), "train", False)
    # Once in another folder first: on a fresh checkout numba compiles the counting kernels here
    # and renames their cache files into __pycache__, which are not the files under test.
    count_task(task, TaskOptions(str(tmp_path / "warm"), TextParser(schema), 1 << 20, (10,)))
    events = record_syncs_and_renames(monkeypatch)
    marker = count_task(task, TaskOptions(str(tmp_path), TextParser(schema), 1 << 20, (10,)))
    replaces = [e for e in events if e.startswith("replace")]
    assert replaces == ["replace C1.values.npy", "replace C1.counts.npy", f"replace {marker.name}"]
    assert synced_before_renamed(events) == [] and marker.exists()
    # The run's folder is synced once, after its last file's rename and before the marker's (not
    # once per file: that doubled vocabulary mode's fsyncs).
    run_syncs = [i for i, e in enumerate(events) if e == "fsync run-000"]
    assert len(run_syncs) == 1
    assert (
        events.index("replace C1.counts.npy")
        < run_syncs[0]
        < events.index(f"replace {marker.name}")
    )

    events.clear()
    build_vocabularies(run_dirs(tmp_path / ".work", [0]), ["C1"], 1, 1 << 20, tmp_path / "vocab")
    replaces = [e for e in events if e.startswith("replace")]
    assert replaces[-1] == "replace vocab.json" and synced_before_renamed(events) == []
    assert "replace C1.ids.npy" in replaces and "replace C1.values.npy" in replaces
    # The vocabulary folder: once after every feature's files, before vocab.json; then once for
    # vocab.json.
    vocab_syncs = [i for i, e in enumerate(events) if e == "fsync vocab"]
    last_file = max(i for i, e in enumerate(events) if e.startswith("replace C1."))
    assert len(vocab_syncs) == 2
    assert last_file < vocab_syncs[0] < events.index("replace vocab.json") < vocab_syncs[1]
