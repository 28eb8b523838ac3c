"""The compiled gathers (dataloader/gather/gather_kernels.py) give exactly the numpy path's
batches."""

from pathlib import Path

import numba  # noqa: E402,F401  a hard dependency: a broken install must fail here, not skip
import numpy as np
import pytest
import torch
from conftest import loader_kwargs, write_tiny_dataset  # noqa: E402

from shardrec.dataloader.digest import batch_digest  # noqa: E402
from shardrec.dataloader.gather import gather_kernels
from shardrec.dataloader.loader import build_loader  # noqa: E402

# Small shuffle levels: the 1000-row split spans several windows, groups and both parts.
SMALL = dict(block_rows=16, window_blocks=8, segment_blocks=4, group_segments=5, gather_rows=96)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("kernels") / "data"
    write_tiny_dataset(d, rows={"train": [300, 450, 250]})
    return d


@pytest.fixture(scope="module")
def jagged_data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("kernels_jagged") / "data"
    write_tiny_dataset(d, multi_hot=("f2",))
    return d


def _stream(d: Path, world_size: int, **kw) -> list[list]:
    kw = {"global_batch_size": 64, "seed": 3, **SMALL, **kw}
    loaders = [
        build_loader(d, "train", rank=r, world_size=world_size, **loader_kwargs(**kw))
        for r in range(world_size)
    ]
    return [list(slices) for slices in zip(*loaders)]


def _both(monkeypatch, d: Path, world_size: int, **kw) -> tuple[list[list], list[list]]:
    """The same stream with the kernels, then with numpy only."""
    compiled = _stream(d, world_size, **kw)
    monkeypatch.setattr(gather_kernels, "AVAILABLE", False)
    plain = _stream(d, world_size, **kw)
    monkeypatch.setattr(gather_kernels, "AVAILABLE", True)
    return compiled, plain


def _assert_same(a: list[list], b: list[list], names: list[str]) -> None:
    assert len(a) == len(b) > 0
    for sa, sb in zip(a, b):
        assert batch_digest(sa, names) == batch_digest(sb, names)
        for x, y in zip(sa, sb):
            assert torch.equal(x.labels, y.labels) and torch.equal(
                x.dense_features, y.dense_features
            )
            assert (
                x.sparse_features.values().dtype == y.sparse_features.values().dtype == torch.int64
            )
            assert torch.equal(x.sparse_features.values(), y.sparse_features.values())
            assert torch.equal(x.sparse_features.lengths(), y.sparse_features.lengths())


@pytest.mark.parametrize(
    "world_size, kw",
    [
        (1, {}),
        (2, {"tail": "pad", "global_batch_size": 96}),
        (2, {"shuffle": False}),
        (4, {"num_workers": 2}),
        (
            1,
            {"window_blocks": 1, "global_batch_size": 16, "gather_rows": 16},
        ),  # shuffled runs inside one part
    ],
)
def test_compiled_gathers_equal_numpy_across_parts(
    monkeypatch, data: Path, world_size: int, kw: dict
):
    compiled, plain = _both(monkeypatch, data, world_size, **kw)
    _assert_same(compiled, plain, ["f0", "f1", "f2", "f3"])
    if kw.get("tail") == "pad":  # padding labels survive the compiled label gather
        assert (compiled[-1][-1].labels == -1.0).all()


def test_compiled_gathers_equal_numpy_with_multi_hot_features(monkeypatch, jagged_data: Path):
    compiled, plain = _both(monkeypatch, jagged_data, 2)
    _assert_same(compiled, plain, ["f0", "f1", "f2", "f3"])


@pytest.mark.parametrize("shuffle", [True, False])  # gathered, or copied part by part
def test_compiled_modulo_folds_raw_ids_like_numpy(monkeypatch, tmp_path: Path, shuffle: bool):
    rng = np.random.default_rng(2)
    for d, n in enumerate((70, 90, 40)):
        # Raw int32 ids, some negative: the fold must be numpy's (non-negative for a positive size).
        np.save(
            tmp_path / f"day_{d}_sparse.npy",
            rng.integers(-(2**31), 2**31 - 1, (n, 3)).astype(np.int32),
        )
        np.save(tmp_path / f"day_{d}_dense.npy", rng.normal(size=(n, 13)).astype(np.float32))
        np.save(tmp_path / f"day_{d}_labels.npy", rng.integers(0, 2, (n, 1)).astype(np.int32))
    compiled, plain = _both(
        monkeypatch, tmp_path, 2, global_batch_size=32, hashes=[1000, 7, 123456], shuffle=shuffle
    )
    _assert_same(compiled, plain, ["cat_0", "cat_1", "cat_2"])
    values = torch.cat([b.sparse_features["cat_1"].values() for batch in compiled for b in batch])
    assert int(values.min()) >= 0 and int(values.max()) < 7


@pytest.mark.parametrize("num_parts", [5, 40])  # a count of starts, then a binary search
def test_group_by_part_matches_a_stable_sort(num_parts: int):
    rng = np.random.default_rng(num_parts)
    sizes = rng.integers(0, 30, num_parts)
    sizes[1] = 0  # an empty part
    part_starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    rows = rng.integers(0, part_starts[-1], 500).astype(np.int64)
    counts, where, local = gather_kernels.group_by_part(rows, part_starts)
    part_of = np.searchsorted(part_starts, rows, side="right") - 1
    order = np.argsort(part_of, kind="stable")
    assert counts.tolist() == np.bincount(part_of, minlength=num_parts).tolist()
    assert where.tolist() == order.tolist()
    assert local.tolist() == (rows[order] - part_starts[part_of[order]]).tolist()


def test_parts_the_kernels_cannot_read_as_one_column_fall_back_exactly(monkeypatch, tmp_path: Path):
    from dataset_writing import write_dataset

    rng = np.random.default_rng(4)
    # float16 dense (numba cannot convert it) over several parts.
    parts = [
        (rng.integers(0, 2, n).astype(np.uint8), rng.normal(size=(n, 3)).astype(np.float16),
         {"a": rng.integers(0, 200, n).astype(np.uint8)})
        for n in (90, 70, 60)
    ]  # fmt: skip
    write_dataset(tmp_path / "f16", ["x", "y", "z"], {"a": 200}, {"train": parts}, "float16")
    compiled, plain = _both(monkeypatch, tmp_path / "f16", 2, global_batch_size=32)
    _assert_same(compiled, plain, ["a"])
    # torchrec days whose sparse dtypes differ (int32, then int64).
    days = tmp_path / "days"
    days.mkdir()
    for d, (n, dtype) in enumerate(((80, np.int32), (70, np.int64), (10, np.int32))):
        np.save(days / f"day_{d}_sparse.npy", rng.integers(0, 10**6, (n, 2)).astype(dtype))
        np.save(days / f"day_{d}_dense.npy", rng.normal(size=(n, 13)).astype(np.float32))
        np.save(days / f"day_{d}_labels.npy", rng.integers(0, 2, (n, 1)).astype(np.int32))
    compiled, plain = _both(monkeypatch, days, 1, global_batch_size=16, hashes=[97, 1000])
    _assert_same(compiled, plain, ["cat_0", "cat_1"])


def test_the_fallback_keeps_the_rows_of_the_last_part_a_part_index_dtype_holds(
    monkeypatch, tmp_path: Path
):
    """256 parts: part 255 is the largest index of uint8, the located rows' dtype; the fallback
    grouped its rows up to index 255 + 1, which wrapped to 0 and left them unwritten."""
    from dataset_writing import write_dataset

    rng = np.random.default_rng(4)
    parts = [
        (rng.integers(0, 2, 4).astype(np.uint8), rng.normal(size=(4, 3)).astype(np.float16),
         {"a": rng.integers(0, 200, 4).astype(np.uint8)})
        for _ in range(256)
    ]  # fmt: skip
    write_dataset(tmp_path / "f16", ["x", "y", "z"], {"a": 200}, {"train": parts}, "float16")
    compiled, plain = _both(monkeypatch, tmp_path / "f16", 1, global_batch_size=32)
    _assert_same(compiled, plain, ["a"])


@pytest.mark.parametrize("key_dtype", [np.uint32, np.int64])
def test_whole_rows_of_several_parts_are_copied_exactly(key_dtype):
    """Rows named by packed keys (slot among the held parts, row inside the part; 4 or 8 bytes)
    are the parts' rows, with the parts held in another order than their indices."""
    rng = np.random.default_rng(5)
    parts = [rng.normal(size=(n, 13)).astype(np.float32) for n in (40, 7, 25)]
    part_of = rng.integers(0, 3, 300).astype(np.uint16)
    local = np.array([rng.integers(0, len(parts[p])) for p in part_of], np.int32)
    slot_of = np.array([2, 0, 1], np.int32)  # part p is held in slot slot_of[p]
    addresses = np.zeros(3, np.int64)
    addresses[slot_of] = [p.ctypes.data for p in parts]
    keys = ((slot_of[part_of].astype(np.int64) << 6) | local).astype(key_dtype)
    out = np.empty((300, 13), np.float32)
    gather_kernels.copy_rows_parts(addresses, parts[0].strides[0], keys, 6, out)
    assert np.array_equal(out, np.stack([parts[p][r] for p, r in zip(part_of, local)]))


@pytest.mark.parametrize(
    "sizes",
    [
        [5] * 40,
        [1, 0, 0, 7, 3] * 10,  # empty parts
        [6, 0, 6, 6] * 10,  # an empty part inside a bucket of two parts
        [3000] * 64 + [1],
        [2],
        [1 << 21, 3, 0, 2, 1 << 21],  # buckets of 8 rows: one meets three parts
    ],
)
def test_keys_of_rows_through_the_buckets_are_their_slot_and_row_in_the_part(sizes: list[int]):
    """locate_keys gives each global row (slot of its part << shift) | its row in the part, as
    the search finds the part, and counts the rows of parts not held."""
    from shardrec.dataloader.gather.many_parts import KeyBuckets

    part_starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    rng = np.random.default_rng(len(sizes))
    rows = rng.integers(0, part_starts[-1], 5000).astype(np.int64)
    part_of, local = np.empty(5000, np.int64), np.empty(5000, np.int64)
    gather_kernels.locate(rows, part_starts, part_of, local)
    buckets = KeyBuckets(part_starts, sizes)
    slot_of = rng.permutation(len(sizes))
    shift = max(sizes).bit_length()
    key_base = (slot_of << shift) - part_starts[:-1]
    keys = np.empty(5000, np.int64)
    missing = gather_kernels.locate_keys(
        rows, part_starts, buckets.shift, buckets.second_start, key_base[buckets.parts],
        key_base, keys,
    )  # fmt: skip
    assert missing == 0
    assert keys.tolist() == ((slot_of[part_of] << shift) | local).tolist()
    key_base[part_of[0]] = gather_kernels.UNHELD  # that part is not held
    missing = gather_kernels.locate_keys(
        rows, part_starts, buckets.shift, buckets.second_start, key_base[buckets.parts],
        key_base, keys,
    )  # fmt: skip
    assert missing == np.sum(part_of == part_of[0])


def test_whole_rows_of_one_part_are_copied_exactly():
    rng = np.random.default_rng(6)
    wide = rng.normal(size=(50, 16)).astype(np.float32)
    idx = rng.integers(0, 50, 400).astype(np.int64)
    for column in (wide[:, :13].copy(), wide[:, :13]):  # rows packed; rows 64 bytes apart
        out = np.empty((400, 13), np.float32)
        gather_kernels.copy_rows(column, idx, out)
        assert np.array_equal(out, column[idx])


@pytest.mark.parametrize(
    "sizes", [[5] * 40, [1, 0, 0, 7, 3] * 10, [3000] * 64 + [1]]
)  # empty parts; one tiny
def test_rows_located_through_the_coarse_index_are_where_the_search_puts_them(sizes: list[int]):
    from shardrec.dataloader.gather.many_parts import part_index

    part_starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    rows = np.random.default_rng(len(sizes)).integers(0, part_starts[-1], 2000).astype(np.int64)
    searched, indexed = (
        (np.empty(2000, np.int64), np.empty(2000, np.int64)),
        (np.empty(2000, np.int64), np.empty(2000, np.int64)),
    )
    gather_kernels.locate(rows, part_starts, *searched)
    gather_kernels.locate_indexed(rows, part_starts, *part_index(part_starts, sizes), *indexed)
    assert (
        searched[0].tolist() == indexed[0].tolist() and searched[1].tolist() == indexed[1].tolist()
    )


def test_copy_ids_writes_runs_at_an_offset_and_counts_a_negative_id_as_huge():
    """copy_ids copies n consecutive ids into gather positions pos.. (across batch rows) and
    returns their largest as uint64, a negative id of a signed column as huge (as take_ids does),
    so the loader's bounds check refuses it in an unshuffled stream too."""
    out = np.full((3, 2, 4), -7, np.int64)  # 3 batches of 4 rows, 2 features
    src = np.array([5, 6, -2, 8, 9, 1], np.int32)
    hi = gather_kernels.copy_ids(src, 1, out, 1, 3, 5)  # src[1:6] to positions 3..7
    assert out[:, 1, :].reshape(-1).tolist() == [-7, -7, -7, 6, -2, 8, 9, 1, -7, -7, -7, -7]
    assert (out[:, 0, :] == -7).all()
    assert hi == np.uint64(2**64 - 2)
    assert gather_kernels.copy_ids(src, 3, out, 0, 0, 2) == 9
    assert gather_kernels.copy_ids(src.astype(np.uint16), 0, out, 0, 0, 0) == 0
