"""The fast paths of preprocessing give exactly the bytes and numbers of the plain ones."""

from __future__ import annotations

import numpy as np
import pytest

from shardrec.tools.preprocess.ids.id_maps import hash_ids
from shardrec.tools.preprocess.parse import parse_kernel
from shardrec.tools.preprocess.parts import column_kernels
from shardrec.tools.preprocess.parts.feature_stats import feature_stats, id_counts, id_frequencies


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64])
def test_hashing_into_columns_equals_hash_ids(dtype):
    rng = np.random.default_rng(1)
    values = rng.integers(0, 2**63, (500, 6), dtype=np.uint64)
    missing = rng.random((500, 6)) < 0.2
    cards = np.array([2, 255, 256, 70_000, 2**33, 10**7], dtype=np.int64)
    feats = np.array([0, 1, 2] if dtype == np.uint8 else [3, 4, 5], dtype=np.int64)
    rows = np.flatnonzero(rng.random(500) < 0.7)  # a subset of rows, as when bad rows are dropped
    out = np.full((len(feats), len(rows) + 7), 99, dtype=dtype)
    column_kernels.hash_rows_into(values, missing, rows, feats, cards, out, 7)
    for j, f in enumerate(feats):
        want = hash_ids(values[rows, f], missing[rows, f], int(cards[f])).astype(dtype)
        np.testing.assert_array_equal(out[j, 7:], want)
    assert (out[:, :7] == 99).all()  # nothing written before the offset


@pytest.mark.parametrize("compiled", [True, False])
def test_stats_from_counts_equal_stats_from_sorted_bincount(monkeypatch, compiled: bool):
    assert parse_kernel.AVAILABLE, "numba is a hard dependency: the compiled kernels must be there"
    monkeypatch.setattr(parse_kernel, "AVAILABLE", compiled)
    rng = np.random.default_rng(2)
    card = 5000
    cols = [np.minimum(rng.zipf(1.3, n), card - 1).astype(np.uint16) for n in (3000, 0, 4000)]
    counts, sampled = id_counts(cols, card)
    ref = np.sort(np.bincount(np.concatenate(cols), minlength=card))[::-1]
    ref = ref[ref > 0]
    np.testing.assert_array_equal(np.sort(counts)[::-1], ref)
    np.testing.assert_array_equal(id_frequencies(cols, card)[0], ref)
    stats = feature_stats(counts, card, None, sampled)
    cum = np.cumsum(ref)
    assert stats["top1_share"] == round(float(cum[50 - 1] / cum[-1]), 6)
    assert stats["top10_share"] == round(float(cum[min(500, len(cum)) - 1] / cum[-1]), 6)
    assert stats["distinct_ids"] == len(ref) and stats["lookups"] == 7000 and stats["sampled"] == 0


def test_stats_refuse_ids_outside_the_table():
    with pytest.raises(ValueError):
        id_counts([np.array([0, 1, 10], dtype=np.uint8)], 10)


@pytest.mark.parametrize("delimiter", ["\t", ","])
def test_word_at_a_time_integers_agree_with_the_numpy_parser(delimiter):
    # The compiled parser decodes 1-7 digit integers as one 64-bit word and falls back to its
    # byte loop for everything else; both must give the numpy parser's rows.
    from shardrec.tools.preprocess.parse.criteo_text import Schema, parse_chunk

    # min_fields=1: rows of any length are right-padded, so short rows keep integers in the text's
    # last bytes.
    schema = Schema(num_dense=5, num_sparse=1, delimiter=delimiter, min_fields=1)
    values = ["", "0", "7", "00", "0000005", "1234567", "12345678", "123456789", "99999999", "-1", "-0", "260.0",
              "5.0", "1a", "a1", "9" * 18, "9" * 19, "\x80", "5\x00", "4/", "3:", "12 ", " 1",
              "0000000", "9999999"]  # fmt: skip
    rng = np.random.default_rng(7)
    rows = []
    for _ in range(4000):
        fields = (
            [str(rng.integers(0, 2))]
            + [values[rng.integers(len(values))] for _ in range(5)]
            + ["ab"]
        )
        rows.append(
            delimiter.join(fields[: rng.integers(1, 8)]) + ("\r" if rng.random() < 0.05 else "")
        )
    rows += [
        "1",
        f"1{delimiter}1",
        f"1{delimiter}12",
        f"1{delimiter}1234567",
    ]  # integers in the text's last bytes
    text = ("\n".join(rows) + "\n").encode()
    a, b = parse_chunk(text, schema, engine="compiled"), parse_chunk(text, schema, engine="numpy")
    for name in ("reason", "bad_field", "row_start", "row_end"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    ok = a.ok
    assert 0.2 < ok.mean() < 0.9
    for name in ("labels", "dense", "dense_missing"):
        np.testing.assert_array_equal(getattr(a, name)[ok], getattr(b, name)[ok], err_msg=name)
    assert a.dense[-1, 0] == 1234567 and a.ok[-4:].all()


@pytest.mark.parametrize("dense_dtype", ["float32", "float16"])
def test_the_compiled_dense_transform_equals_transform_dense(dense_dtype: str):
    """append_rows takes the compiled log1p path for the default transform; its bytes are
    transform_dense's for every kind of value (negative, zero, missing, huge) and for rows taken
    out of order, as when bad rows are dropped and a piece is split between train and val."""
    from shardrec.tools.preprocess.parse.criteo_text import ParsedChunk, transform_dense
    from shardrec.tools.preprocess.parts.dense_table import LOG1P_TABLE_SIZE, log1p_table
    from shardrec.tools.preprocess.parts.part_columns import PartColumns, append_rows, id_groups

    assert parse_kernel.AVAILABLE  # numba is a dependency: the compiled path must be the one tested
    rng = np.random.default_rng(5)
    n = 400
    dense = rng.integers(-5, 2**40, (n, 3), dtype=np.int64)
    dense[rng.random((n, 3)) < 0.3] = rng.integers(-3, 3, 1)[0]
    # Values on both sides of the end of the log1p table (looked up below it, computed past it).
    small = rng.random((n, 3)) < 0.4
    dense[small] = rng.integers(0, LOG1P_TABLE_SIZE + 300, int(small.sum()))
    dense[:6, 0] = [
        LOG1P_TABLE_SIZE - 2,
        LOG1P_TABLE_SIZE - 1,
        LOG1P_TABLE_SIZE,
        LOG1P_TABLE_SIZE + 1,
        0,
        1,
    ]
    dense_missing = rng.random((n, 3)) < 0.2
    dense[dense_missing] = 0  # the parser leaves missing values at 0
    sparse = rng.integers(0, 2**63, (n, 1), dtype=np.uint64)
    chunk = ParsedChunk(
        labels=rng.integers(0, 2, n).astype(np.uint8),
        dense=dense,
        dense_missing=dense_missing,
        sparse=sparse,
        sparse_missing=np.zeros((n, 1), bool),
        reason=np.full(n, -1, np.int8),
        bad_field=np.full(n, -1, np.int16),
        row_start=np.zeros(n, np.int64),
        row_end=np.zeros(n, np.int64),
    )
    rows = rng.permutation(n)[: n // 2]
    rows = np.concatenate([np.arange(6), rows[rows >= 6]])
    cols = PartColumns(8, 3, dense_dtype, id_groups((1000,)))
    append_rows(cols, chunk, rows, "log1p", dense_dtype, ["C1"], (1000,), None)
    want = transform_dense(dense[rows], dense_missing[rows], "log1p", dense_dtype)
    assert cols.rows == len(rows) and cols.dense[: cols.rows].tobytes() == want.tobytes()
    every = np.arange(
        LOG1P_TABLE_SIZE
    )  # each value the table holds, as transform_dense computes it
    want = transform_dense(every, np.zeros(len(every), bool), "log1p", dense_dtype)
    assert log1p_table(dense_dtype)[0].tobytes() == want.tobytes()


@pytest.mark.parametrize("vocab_path", ["", "vocab"])
def test_hashing_tasks_run_without_numpys_huge_page_hint(monkeypatch, vocab_path: str):
    """A hashing task's arrays are written once and dropped: numpy's huge-page hint is off while
    it runs (~1/6 of a Parquet run's CPU), on again after; vocabulary mode keeps it."""
    from numpy._core.multiarray import _set_madvise_hugepage

    from shardrec.tools.preprocess.tasks import task_run as task_mod

    def hint_now() -> bool:
        now = _set_madvise_hugepage(True)
        _set_madvise_hugepage(now)
        return now

    seen = []
    monkeypatch.setattr(task_mod, "_run_task", lambda *args: seen.append(hint_now()))
    opts = type("Opts", (), {"vocab_path": vocab_path})()
    before = _set_madvise_hugepage(True)
    try:
        task_mod.run_task(None, opts)
        assert seen == [bool(vocab_path)]
        assert hint_now() is True
    finally:
        _set_madvise_hugepage(before)
