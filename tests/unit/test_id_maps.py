"""Raw values -> embedding row ids (tools/preprocess/ids/id_maps.py): the hash a dataset's ids
come from, pinned so that data preprocessed by an earlier version gets the same ids, and the
vocabulary's ids, counts and compiled-lookup index."""

from __future__ import annotations

import numpy as np
import pytest

from shardrec.dataloader.util.splitmix import mix64, mix64_scalar
from shardrec.tools.preprocess.ids.id_maps import (
    MISSING_ID,
    OOV_ID,
    Vocabulary,
    count_values,
    hash_bytes,
    hash_ids,
    merge_counts,
)

MASK = (1 << 64) - 1


def _splitmix64_finalizer(z: int) -> int:
    """The published splitmix64 finalizer (Steele, Lea, Flood 2014), written out here."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


VALUES = [0, 1, 0xDEADBEEF, 2**63 + 5, MASK]


def test_mix64_is_splitmix64s_finalizer_in_numpy_and_in_compiled_kernels():
    expected = [_splitmix64_finalizer(v) for v in VALUES]
    assert [int(x) for x in mix64(np.array(VALUES, np.uint64))] == expected
    assert [int(mix64_scalar(np.uint64(v))) for v in VALUES] == expected
    assert expected[1] == 6238072747940578789  # pinned: the ids of every hashed dataset


def test_string_values_hash_as_before():
    """Big-endian words of 8 bytes, then the length: the ids of string categoricals of datasets
    preprocessed before stay the same."""

    def reference(data: bytes) -> int:
        h = 0
        for k in range(0, len(data), 8):
            h = _splitmix64_finalizer(h ^ int.from_bytes(data[k : k + 8], "big"))
        return _splitmix64_finalizer(h ^ len(data))

    for data in (b"", b"abc", b"0123456789abcdef!", b"\xff" * 9):
        assert hash_bytes(data) == reference(data)
    assert hash_bytes(b"abc") == 16155245716616363998
    assert hash_bytes(b"abc") != hash_bytes(b"abc\x00")  # the length counts
    ids = hash_ids(
        np.array([hash_bytes(b"abc"), 7, 0], np.uint64), np.array([False, False, True]), 1000
    )
    assert ids.tolist() == [470, 371, MISSING_ID]


def test_count_values_counts_present_values_only():
    values = np.array([5, 3, 5, 9, 5, 3, 2**40], np.uint64)
    missing = np.array([False, False, False, True, False, False, False])
    distinct, counts = count_values(values, missing)
    assert distinct.tolist() == [3, 5, 2**40] and counts.tolist() == [2, 3, 1]
    distinct, counts = count_values(values, np.ones(7, bool))
    assert distinct.tolist() == [] and counts.tolist() == []


def test_merge_counts_sums_chunks_and_nothing_is_empty():
    merged = merge_counts(
        [
            (np.array([3, 5], np.uint64), np.array([2, 1])),
            (np.array([1, 5], np.uint64), np.array([4, 6])),
        ]
    )
    assert [m.tolist() for m in merged] == [[1, 3, 5], [4, 2, 7]]
    assert [m.tolist() for m in merge_counts([])] == [[], []]


def test_vocabulary_ids_run_from_2_by_decreasing_count_and_the_rest_is_oov():
    vocab = Vocabulary.build(
        np.array([10, 20, 30, 40], np.uint64), np.array([5, 9, 5, 1]), min_count=2
    )
    assert (MISSING_ID, OOV_ID, vocab.cardinality) == (0, 1, 5)
    values = np.array([20, 10, 30, 40, 99, 10], np.uint64)
    missing = np.array([False, False, False, False, False, True])
    assert vocab.lookup(values, missing).tolist() == [2, 3, 4, OOV_ID, OOV_ID, MISSING_ID]


@pytest.mark.parametrize("n", [1, 40, 5000])
def test_the_compiled_lookups_buckets_hold_exactly_their_values(n: int):
    rng = np.random.default_rng(n)
    values = np.unique(rng.integers(0, 2**40, n).astype(np.uint64))
    vocab = Vocabulary(values, np.arange(2, len(values) + 2, dtype=np.uint64))
    starts, shift = vocab.bucket_starts
    buckets = values >> np.uint64(shift)
    assert len(starts) == int(buckets[-1]) + 2 and int(starts[-1]) == len(values)
    for b in range(len(starts) - 1):
        assert np.all(buckets[int(starts[b]) : int(starts[b + 1])] == b)
    assert len(values) / (len(starts) - 1) <= 64  # about 32 values a bucket
