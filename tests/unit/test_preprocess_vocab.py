"""Vocabulary mode in bounded memory: the external merge gives today's vocabularies and datasets.

The reference is the in-memory implementation the merge replaced (every task's pairs
concatenated and sorted at once, then Vocabulary.build), kept here only as the expected result.
The dataset digests were taken from that implementation's output before it was replaced.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dataset_writing import old_layout_files

from shardrec.tools.preprocess.ids.id_maps import Vocabulary, count_values, merge_counts
from shardrec.tools.preprocess.ids.vocab import build_vocabularies, load_vocabularies, merge_runs
from shardrec.tools.preprocess.parse.criteo_text import Schema, parse_chunk
from shardrec.tools.preprocess.pipeline import PreprocessConfig, run_preprocess
from shardrec.tools.preprocess.vocab_count import count_columns
from shardrec.tools.synth.criteo import write_dataset

# sha256 over (relative path, bytes) of every .npy of the dataset, from the in-memory
# implementation (commit f6c72cd) on write_dataset(rows=6000, seed=5, max_vocab=400), --min-count 2,
# --chunk-mb 0.2; taken since one file per part over each column as that layout's file held it
# (dataset_writing.old_layout_files): the same digests, the same rows and ids.
TODAYS_DIGESTS = {
    "days": "63c21f850b1ee5ca3bac0340f8fa08e058b0912d09ab4cef9e156b534e0dbe39",
    "kaggle": "27661e16dc3e26db64bb4ba1da90563f3aa8b89f587a4589f3d5c18e4a92edb9",
}


def _digest(out: Path) -> str:
    h = hashlib.sha256()
    files = old_layout_files(out)
    for rel in sorted(files, key=Path):
        h.update(rel.encode())
        h.update(files[rel])
    return h.hexdigest()


def _reference_vocab(runs: list[tuple[np.ndarray, np.ndarray]], min_count: int) -> Vocabulary:
    values, counts = merge_counts(runs)  # everything at once, in memory
    return Vocabulary.build(values, counts, min_count)


@pytest.mark.parametrize("kind", ["days", "kaggle"])
@pytest.mark.parametrize("memory_mb", [256, 0.001])  # 0.001 MiB: 16 pairs, many runs and ranges
def test_dataset_bytes_equal_the_in_memory_implementation(
    tmp_path: Path, kind: str, memory_mb: float
):
    raw = tmp_path / "raw"
    write_dataset(raw, rows=6000, seed=5, days=3 if kind == "days" else 0, max_vocab=400)
    out = tmp_path / "out"
    run_preprocess(
        PreprocessConfig([raw], out, min_count=2, chunk_mb=0.2, vocab_memory_mb=memory_mb)
    )
    assert _digest(out) == TODAYS_DIGESTS[kind]
    info = json.loads((out / ".work" / "vocab" / "vocab.json").read_text())
    # The tiny budget really did merge in pieces; the default one in one range per feature.
    assert (max(info["merge_ranges"]) > 10) if memory_mb < 1 else (max(info["merge_ranges"]) == 1)


@pytest.mark.parametrize("largest", [1, 1000, 2**32, 2**64 - 1])
def test_counting_gives_np_uniques_values_and_counts(largest: int):
    """32-bit values are sorted narrow, wider ones as they are; empty and all-missing columns
    too."""
    rng = np.random.default_rng(largest % 1000)
    values = rng.integers(0, largest, 3000, dtype=np.uint64, endpoint=True)
    for missing in (np.zeros(3000, bool), rng.random(3000) < 0.3, np.ones(3000, bool)):
        got, want = count_values(values, missing), np.unique(values[~missing], return_counts=True)
        assert [(a.dtype, a.tolist()) for a in got] == [(a.dtype, a.tolist()) for a in want]


def test_compiled_column_counts_give_np_uniques_values_and_counts():
    """Each column of a [rows, features] piece over a subset of its rows: columns of 32-bit values
    (the compiled path), a column with one wider value (counted in 64 bits), an all-missing one; no
    rows."""
    rng = np.random.default_rng(7)
    values = rng.integers(0, 50, (2000, 4), dtype=np.uint64)
    values[:, 1] = rng.integers(0, 2**32, 2000, dtype=np.uint64)
    values[5, 2] = np.uint64(2**64 - 1)
    missing = rng.random((2000, 4)) < 0.2
    missing[:, 3] = True
    for rows in (np.flatnonzero(rng.random(2000) < 0.7), np.arange(2000), np.zeros(0, np.int64)):
        for f, got in enumerate(count_columns(values, missing, rows)):
            want = np.unique(values[rows, f][~missing[rows, f]], return_counts=True)
            assert [(a.dtype, a.tolist()) for a in got] == [(a.dtype, a.tolist()) for a in want]


def test_two_workers_count_and_map_in_one_pool_with_the_same_bytes(tmp_path: Path, monkeypatch):
    """The counting and preprocessing passes share one pool: each worker starts (imports, kernels)
    once."""
    from shardrec.tools.preprocess import pool

    made = []

    class Counted(pool.ProcessPoolExecutor):
        def __init__(self, *args, **kwargs):
            made.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(pool, "ProcessPoolExecutor", Counted)
    raw = tmp_path / "raw"
    write_dataset(raw, rows=6000, seed=5, days=3, max_vocab=400)
    out = tmp_path / "out"
    run_preprocess(PreprocessConfig([raw], out, min_count=2, chunk_mb=0.2, workers=2))
    assert _digest(out) == TODAYS_DIGESTS["days"]
    assert len(made) == 1


def test_several_merge_ranges_give_the_reference_vocabulary(tmp_path: Path):
    rng = np.random.default_rng(1)
    runs, dirs = [], []
    for r in range(6):  # runs of very different sizes, overlapping value ranges, skewed counts
        values = np.unique(rng.integers(0, 2_000 * (r + 1), 300 * (r + 1)).astype(np.uint64))
        counts = rng.zipf(1.5, len(values)).astype(np.int64)
        runs.append((values, counts))
        d = tmp_path / f"run-{r}"
        d.mkdir()
        np.save(d / "C1.values.npy", values)
        np.save(d / "C1.counts.npy", counts)
        dirs.append(d)
    ranges = list(merge_runs(runs, 64))
    assert len(ranges) > 20 and all(len(v) <= 64 for v, _ in ranges)
    merged_v = np.concatenate([v for v, _ in ranges])
    np.testing.assert_array_equal(merged_v, merge_counts(runs)[0])
    for min_count in (1, 2, 5):
        info = build_vocabularies(dirs, ["C1"], min_count, 64 * 64, tmp_path / f"vocab-{min_count}")
        assert info["merge_ranges"][0] > 20
        (got,) = load_vocabularies(tmp_path / f"vocab-{min_count}", ["C1"])
        want = _reference_vocab(runs, min_count)
        assert isinstance(got.sorted_values, np.memmap) and isinstance(got.ids, np.memmap)
        np.testing.assert_array_equal(got.sorted_values, want.sorted_values)
        np.testing.assert_array_equal(got.ids, want.ids)
        assert info["cardinalities"] == [want.cardinality]


def test_a_budget_below_the_run_count_is_one_clear_error(tmp_path: Path):
    dirs = []
    for r in range(20):
        d = tmp_path / f"run-{r}"
        d.mkdir()
        np.save(d / "C1.values.npy", np.arange(r, r + 50, dtype=np.uint64))
        np.save(d / "C1.counts.npy", np.ones(50, np.int64))
        dirs.append(d)
    with pytest.raises(
        ValueError, match="below the 20 count runs it must merge; raise --vocab-memory-mb"
    ):
        build_vocabularies(dirs, ["C1"], 1, 16 * 64, tmp_path / "vocab")


def test_counting_spills_runs_and_a_rerun_reuses_them(tmp_path: Path):
    raw = tmp_path / "raw"
    (path,) = write_dataset(raw, rows=3000, seed=2, max_vocab=300)
    out = tmp_path / "out"
    cfg = PreprocessConfig([raw], out, min_count=1, chunk_mb=64, vocab_memory_mb=0.001)
    run_preprocess(cfg)
    work = out / ".work"
    assert json.loads((work / "count-00000.json").read_text())["runs"] >= 1
    # Reference: the training rows (6/7 of the lines, Kaggle layout) counted at once.
    chunk = parse_chunk(path.read_bytes(), Schema())
    train = np.arange(chunk.rows) < 6 * chunk.rows // 7
    vocabs = load_vocabularies(work / "vocab", Schema().sparse_names)
    for f in (0, 5, 25):
        values, counts = count_values(chunk.sparse[train, f], chunk.sparse_missing[train, f])
        np.testing.assert_array_equal(vocabs[f].ids, Vocabulary.build(values, counts, 1).ids)
    before = _digest(out)
    (work / "vocab" / "vocab.json").unlink()  # merge again from the count runs kept on disk
    (out / "manifest.json").unlink()
    run_preprocess(cfg)
    assert _digest(out) == before


def test_32_bit_values_are_mapped_at_half_the_width_with_the_same_ids(tmp_path: Path):
    # Every worker maps the vocabularies whole: on 52 M distinct Criteo values uint64 files were 832
    # MB.
    rng = np.random.default_rng(3)
    small = np.unique(rng.integers(0, 2**32, 500, dtype=np.uint64))
    wide = np.append(
        small[:-1], np.uint64(2**40)
    )  # one value past 32 bits: that feature stays uint64
    d = tmp_path / "run-0"
    d.mkdir()
    counts = rng.integers(1, 5, len(small)).astype(np.int64)
    for name, values in (("C1", small), ("C2", wide)):
        np.save(d / f"{name}.values.npy", values)
        np.save(d / f"{name}.counts.npy", counts)
    build_vocabularies([d], ["C1", "C2"], 2, 1 << 20, tmp_path / "vocab")
    narrow, full = load_vocabularies(tmp_path / "vocab", ["C1", "C2"])
    assert (narrow.sorted_values.dtype, narrow.ids.dtype, full.sorted_values.dtype) == (
        np.uint32,
        np.uint32,
        np.uint64,
    )
    # Queries: kept values, dropped ones, missing, and values whose low 32 bits equal a kept value.
    queries = np.concatenate(
        [small, small + np.uint64(2**32), rng.integers(0, 2**32, 200, dtype=np.uint64)]
    )
    missing = np.zeros(len(queries), bool)
    missing[::7] = True
    for got, values in ((narrow, small), (full, wide)):
        want = Vocabulary.build(values, counts, 2).lookup(queries, missing)
        ids = got.lookup(queries, missing)
        assert ids.dtype == np.uint64
        np.testing.assert_array_equal(ids, want)
    kept_plus_2_32 = small[counts >= 2] + np.uint64(2**32)
    assert (
        narrow.lookup(kept_plus_2_32, np.zeros(len(kept_plus_2_32), bool)) == 1
    ).all()  # OOV, not a match


_MERGE_IN_A_FRESH_PROCESS = """
import gc, sys
from pathlib import Path
import numpy as np
from shardrec.tools.preprocess.ids.vocab import build_vocabularies

def anonymous_kb():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Anonymous:"):
            return int(line.split()[1])

tmp, rng, dirs = Path(sys.argv[1]), np.random.default_rng(0), []
for r in range(4):
    d = tmp / f"run-{r}"
    d.mkdir()
    values = np.unique(rng.integers(0, 2**32, 500_000, dtype=np.uint64))
    np.save(d / "C1.values.npy", values)
    np.save(d / "C1.counts.npy", np.ones(len(values), np.int64))
    dirs.append(d)
gc.collect()
before = anonymous_kb()
build_vocabularies(dirs, ["C1"], 1, 256 << 20, tmp / "vocab")
gc.collect()
print(before, anonymous_kb())
"""


@pytest.mark.skipif(
    not Path("/proc/self/smaps_rollup").is_file(), reason="no smaps_rollup (Linux only)"
)
def test_the_merge_gives_its_memory_back_before_the_workers_map(tmp_path: Path):
    # The merging process lives on while the workers map the vocabularies: what it freed must not
    # stay held.
    res = subprocess.run(
        [sys.executable, "-c", _MERGE_IN_A_FRESH_PROCESS, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    before, after = map(int, res.stdout.split())
    assert after <= before + 4096, (before, after)  # kB: 2 M pairs merged left ~11 MB held before


@pytest.mark.parametrize(
    "n, dtype, largest",
    [
        (0, np.uint32, 2**32),
        (1, np.uint32, 2**32),
        (5, np.uint32, 100),
        (3000, np.uint32, 2**32),
        (2000, np.uint64, 2**64),
    ],
)
@pytest.mark.parametrize("tables", ["hash", "search"])
def test_the_compiled_lookup_gives_the_ids_of_vocabulary_lookup(
    n: int, dtype, largest: int, tables: str, monkeypatch
):
    """Kept values, values between and past them, missing ones, rows out of order: the compiled
    lookup writes Vocabulary.lookup's ids into a part's id columns at an offset, by hash tables
    (32-bit values, within the budget) or by bucket search (a budget spent)."""
    from shardrec.tools.preprocess.ids import vocab_kernel as ids_kernel

    if tables == "search":
        monkeypatch.setattr(ids_kernel, "HASH_BUDGET_BYTES", 0)
    rng = np.random.default_rng(n)
    kept = np.unique(rng.integers(0, largest, n, dtype=np.uint64, endpoint=False)).astype(dtype)
    vocab = Vocabulary(kept, (rng.permutation(len(kept)) + 2).astype(np.uint32))
    hits = (
        kept.astype(np.uint64)[rng.integers(0, len(kept), 500)]
        if len(kept)
        else np.zeros(0, np.uint64)
    )
    edges = np.array([0, 1, 2**32 - 1, 2**32, 2**64 - 1], np.uint64)
    values = np.concatenate(
        [hits, rng.integers(0, largest, 500, dtype=np.uint64, endpoint=False), edges]
    )
    values = np.stack([values, values[::-1], values], axis=1)
    missing = rng.random(values.shape) < 0.1
    rows = rng.permutation(len(values))[:-3]
    vocabs = [vocab, Vocabulary(np.array([0, 7], dtype), np.array([3, 2], np.uint32)), vocab]
    out = np.zeros((2, len(rows) + 7), np.uint32)
    ids_kernel.lookup_features_into(vocabs, values, missing, rows, np.array([2, 1]), out, 7)
    for j, f in enumerate([2, 1]):
        assert np.array_equal(out[j, 7:], vocabs[f].lookup(values[rows, f], missing[rows, f])), f
    hashed = tables == "hash" and 0 < len(kept) and largest <= 2**32
    assert bool(ids_kernel.tables_for(vocabs).bits[2]) == hashed


def test_a_second_run_into_a_rebuilt_directory_maps_its_own_vocabularies(tmp_path: Path):
    """One process (a notebook, a script) preprocesses in vocabulary mode, removes the output and
    preprocesses other rows into the same path: the second dataset is the one a fresh process
    writes, not ids looked up in the first run's vocabularies."""
    import shutil

    first, second = tmp_path / "a", tmp_path / "b"
    write_dataset(first, rows=3000, seed=5, days=0, max_vocab=400)
    write_dataset(second, rows=3000, seed=9, days=0, max_vocab=400)
    alone = tmp_path / "alone"
    run_preprocess(PreprocessConfig([second], alone, min_count=2, chunk_mb=0.2))
    out = tmp_path / "out"
    run_preprocess(PreprocessConfig([first], out, min_count=2, chunk_mb=0.2))
    shutil.rmtree(out)
    run_preprocess(PreprocessConfig([second], out, min_count=2, chunk_mb=0.2))
    assert _digest(out) == _digest(alone)
