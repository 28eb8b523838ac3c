from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import loader_kwargs, write_tiny_dataset

from shardrec.dataloader.digest import batch_digest, stream_digests
from shardrec.dataloader.format.manifest import DatasetError
from shardrec.dataloader.format.part_file import open_split
from shardrec.dataloader.loader import NO_SHUFFLE, PAD_LABEL, build_loader


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("loader") / "data"
    write_tiny_dataset(d)
    return d


@pytest.fixture(scope="module")
def jagged_data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("jagged") / "data"
    write_tiny_dataset(d, multi_hot=("f1", "f3"))
    return d


# Small shuffle levels so the 1000-row tiny split spans several windows, groups and parts,
# and small gathers so an epoch is several runs of batches gathered together.
SMALL = dict(block_rows=16, window_blocks=8, segment_blocks=4, group_segments=5, gather_rows=96)


def _loaders(d: Path, world_size: int, **kw) -> list:
    kw = {"global_batch_size": 64, "seed": 5, **SMALL, **kw}
    return [
        build_loader(d, "train", rank=r, world_size=world_size, **loader_kwargs(**kw))
        for r in range(world_size)
    ]


def _iter_digests(loaders: list) -> list[str]:
    names = loaders[0].feature_names
    return [batch_digest(list(slices), names) for slices in zip(*loaders)]


def test_batch_layout_matches_the_files_without_shuffle(data: Path):
    (loader,) = _loaders(data, 1, shuffle=False)
    parts = open_split(data, "train")
    batch = next(iter(loader))
    assert batch.dense_features.dtype == torch.float32 and batch.dense_features.shape == (64, 4)
    assert batch.labels.dtype == torch.float32 and batch.labels.shape == (64,)
    kjt = batch.sparse_features
    assert kjt.keys() == ["f0", "f1", "f2", "f3"] and kjt.values().dtype == torch.int64
    assert np.array_equal(batch.dense_features.numpy(), parts[0].dense[:64])
    assert np.array_equal(batch.labels.numpy(), parts[0].labels[:64].astype(np.float32))
    for name in kjt.keys():
        assert np.array_equal(
            kjt[name].values().numpy(), parts[0].sparse[name][:64].astype(np.int64)
        )
        assert kjt[name].lengths().tolist() == [1] * 64


def test_unshuffled_epoch_is_the_files_in_order_across_parts(data: Path):
    parts = open_split(data, "train")
    dense = np.concatenate([p.dense for p in parts])
    f3 = np.concatenate([p.sparse["f3"] for p in parts]).astype(np.int64)
    for world_size in (1, 2):
        loaders = _loaders(data, world_size, shuffle=False, global_batch_size=40)
        seen = [
            (b.dense_features.numpy(), b.sparse_features["f3"].values().numpy())
            for bs in zip(*loaders)
            for b in bs
        ]
        assert np.array_equal(np.concatenate([d for d, _ in seen]), dense)
        assert np.array_equal(np.concatenate([v for _, v in seen]), f3)


def test_shuffled_epoch_visits_every_row_once(data: Path):
    (loader,) = _loaders(data, 1, global_batch_size=100, tail="drop")
    parts = open_split(data, "train")
    all_dense = np.concatenate([p.dense for p in parts])
    seen = np.concatenate([b.dense_features.numpy() for b in loader])
    assert len(seen) == 1000
    assert not np.array_equal(seen, all_dense)
    assert np.array_equal(np.sort(seen[:, 0]), np.sort(all_dense[:, 0]))


def test_digests_equal_across_world_sizes_workers_and_reruns(data: Path):
    reference = _iter_digests(_loaders(data, 1))
    assert len(reference) == 1000 // 64 and len(set(reference)) == len(reference)
    assert _iter_digests(_loaders(data, 1)) == reference
    assert _iter_digests(_loaders(data, 2, num_workers=2)) == reference
    assert _iter_digests(_loaders(data, 4, num_workers=3, prefetch=1)) == reference
    assert [d for _, d in stream_digests(_loaders(data, 2), 0, 100)] == reference
    # Another seed or epoch is another stream.
    assert _iter_digests(_loaders(data, 1, seed=6)) != reference
    assert _iter_digests(_loaders(data, 1, epoch=1)) != reference


def test_rank_r_gets_rows_r_times_b_of_each_global_batch(data: Path):
    (whole,) = _loaders(data, 1)
    halves = _loaders(data, 2)
    for k in (0, 7):
        g = whole.batch(k)
        for r, loader in enumerate(halves):
            b = loader.batch(k)
            assert torch.equal(b.dense_features, g.dense_features[r * 32 : (r + 1) * 32])
            assert torch.equal(
                b.sparse_features["f3"].values(),
                g.sparse_features["f3"].values()[r * 32 : (r + 1) * 32],
            )


@pytest.mark.parametrize("tail", ["drop", "pad"])
def test_every_rank_yields_the_same_number_of_batches(data: Path, tail: str):
    loaders = _loaders(data, 4, global_batch_size=96, tail=tail)
    counts = [sum(1 for _ in loader) for loader in loaders]
    expected = 1000 // 96 if tail == "drop" else -(-1000 // 96)
    assert counts == [expected] * 4 and all(len(loader) == expected for loader in loaders)
    assert all(loader.num_samples == 1000 for loader in loaders)


def test_pad_rows_carry_pad_label(data: Path):
    loaders = _loaders(data, 2, global_batch_size=96, tail="pad")
    last = [loader.batch(len(loader) - 1) for loader in loaders]
    labels = torch.cat([b.labels for b in last])
    real = 1000 % 96  # 40 real rows: all in rank 0's slice of 48
    assert (labels[:real] >= 0).all() and (labels[real:] == PAD_LABEL).all()
    assert (last[1].labels == PAD_LABEL).all()
    # Earlier batches carry no padding.
    assert (loaders[1].batch(0).labels >= 0).all()


def test_resume_continues_the_stream_at_another_world_size(data: Path):
    (full,) = _loaders(data, 1)
    reference = _iter_digests([full])
    (first,) = _loaders(data, 1, num_workers=2)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.state_dict()
    assert state["sample_offset"] == 5 * 64 and state["epoch"] == 0
    resumed = _loaders(data, 2, num_workers=1)
    for loader in resumed:
        loader.load_state_dict(state)
        loader.set_epoch(0)  # same epoch: the loaded position is kept
    assert _iter_digests(resumed) == reference[5:]
    assert resumed[0].state_dict()["sample_offset"] == len(reference) * 64
    # A later iter() starts the epoch over.
    assert _iter_digests(resumed) == reference


def test_set_epoch_to_another_epoch_drops_a_loaded_position(data: Path):
    (a,) = _loaders(data, 1)
    state = {**a.state_dict(), "sample_offset": 128}
    (b,) = _loaders(data, 1)
    b.load_state_dict(state)
    b.set_epoch(1)
    assert sum(1 for _ in b) == len(b)
    assert _iter_digests([b]) == _iter_digests(_loaders(data, 1, epoch=1))


def test_state_of_another_stream_is_refused(data: Path):
    (a,) = _loaders(data, 1)
    (b,) = _loaders(data, 1, global_batch_size=32)
    with pytest.raises(ValueError, match="global_batch_size=64 but this loader has 32"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="sample_offset=10 is not a batch boundary"):
        a.load_state_dict({**a.state_dict(), "sample_offset": 10})


def test_multi_hot_features_are_jagged_and_exact(jagged_data: Path):
    loaders = _loaders(jagged_data, 2, shuffle=False)
    parts = open_split(jagged_data, "train")
    batch = loaders[1].batch(1)  # rows 96..127 of part 0
    off, ids = parts[0].offsets["f1"], parts[0].sparse["f1"]
    jt = batch.sparse_features["f1"]
    assert jt.lengths().tolist() == np.diff(off[96:129]).tolist()
    assert jt.values().tolist() == ids[off[96] : off[128]].astype(np.int64).tolist()
    assert batch.sparse_features["f0"].values().tolist() == parts[0].sparse["f0"][96:128].tolist()
    # Shuffled, across parts: every row's ids are its own.
    shuffled = _loaders(jagged_data, 2)[1]
    rows, _ = shuffled.rows(3)
    starts = np.array([0, parts[0].rows])
    assert len({int(np.searchsorted(starts, r, side="right")) for r in rows}) == 2
    expected_lengths, expected_ids = [], []
    for row in rows:
        part = parts[int(row >= parts[0].rows)]
        i = int(row - (0 if part is parts[0] else parts[0].rows))
        o = part.offsets["f3"]
        expected_lengths.append(int(o[i + 1] - o[i]))
        expected_ids += part.sparse["f3"][o[i] : o[i + 1]].astype(np.int64).tolist()
    got = shuffled.batch(3).sparse_features["f3"]
    assert got.lengths().tolist() == expected_lengths and got.values().tolist() == expected_ids
    # Shuffled, across parts and world sizes: still one stream.
    assert _iter_digests(_loaders(jagged_data, 1)) == _iter_digests(
        _loaders(jagged_data, 2, num_workers=2)
    )


def test_a_resumed_jagged_stream_continues_at_another_world_size(jagged_data: Path):
    (full,) = _loaders(jagged_data, 1)
    reference = _iter_digests([full])
    (first,) = _loaders(jagged_data, 1)
    it = iter(first)
    for _ in range(6):
        batch = next(it)
    assert (batch.sparse_features["f1"].lengths() == 0).any()  # empty lists travel as length 0
    resumed = _loaders(jagged_data, 4, num_workers=2)
    for loader in resumed:
        loader.load_state_dict(first.state_dict())
    assert _iter_digests(resumed) == reference[6:]


def test_bad_arguments_and_small_splits_are_clear_errors(tmp_path: Path, data: Path):
    with pytest.raises(ValueError, match="global_batch_size 64 does not divide by world_size 3"):
        build_loader(data, "train", global_batch_size=64, rank=0, world_size=3)
    with pytest.raises(ValueError, match="rank 2 is not in"):
        build_loader(data, "train", global_batch_size=64, rank=2, world_size=2)
    with pytest.raises(
        DatasetError, match="split 'val' has 256 rows, fewer than one global batch of 512"
    ):
        build_loader(data, "val", global_batch_size=512, rank=0, world_size=1)
    assert (
        len(build_loader(data, "val", global_batch_size=512, rank=0, world_size=1, tail="pad")) == 1
    )
    write_tiny_dataset(tmp_path / "empty", rows={"train": [0]})
    with pytest.raises(DatasetError, match="split 'train' has no rows"):
        build_loader(tmp_path / "empty", "train", global_batch_size=8, rank=0, world_size=1)
    with pytest.raises(DatasetError, match="no split 'dev'"):
        build_loader(data, "dev", global_batch_size=8, rank=0, world_size=1)


def test_missing_and_truncated_files_are_named_at_build(tmp_path: Path):
    write_tiny_dataset(tmp_path)
    (tmp_path / "train" / "part-00001.arrow").unlink()
    with pytest.raises(DatasetError, match="train/part-00001.arrow: missing"):
        build_loader(tmp_path, "train", global_batch_size=8, rank=0, world_size=1)
    victim = tmp_path / "val" / "part-00000.arrow"
    victim.write_bytes(victim.read_bytes()[:-3])
    with pytest.raises(DatasetError, match="val/part-00000.arrow: .* bytes on disk, manifest says"):
        build_loader(tmp_path, "val", global_batch_size=8, rank=0, world_size=1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_are_pinned_then_copied_without_blocking(data: Path):
    (loader,) = _loaders(data, 1, device="cuda", num_workers=1)
    assert loader.pin_memory  # the default for a CUDA device
    batch = next(iter(loader))
    assert (
        batch.dense_features.is_cuda
        and batch.sparse_features.values().is_cuda
        and batch.labels.is_cuda
    )
    (cpu,) = _loaders(data, 1, pin_memory=True)
    assert cpu.batch(0).dense_features.is_pinned()
    assert torch.equal(batch.dense_features.cpu(), cpu.batch(0).dense_features)


def test_batches_for_the_cpu_are_not_pinned_even_where_cuda_exists(
    data: Path, monkeypatch: pytest.MonkeyPatch
):
    """Pinning makes a CUDA context on GPU 0: a CPU job on a GPU host must not make one."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    (loader,) = _loaders(data, 1)
    assert not loader.pin_memory
    assert loader.batch(0).dense_features.device.type == "cpu"
    (to_gpu,) = _loaders(data, 1, device="cuda")  # built only: nothing is moved until iterated
    assert to_gpu.pin_memory


def test_stopping_early_with_workers_leaves_no_thread_behind(data: Path):
    import threading
    import time

    (loader,) = _loaders(data, 1, num_workers=2)
    it = iter(loader)
    next(it), next(it)
    assert (
        loader.state_dict()["sample_offset"] == 2 * 64
    )  # counted as handed over, not as prefetched
    del it  # the consumer walks away mid-epoch
    deadline = time.monotonic() + 5
    while (
        any(t.name.startswith("shardrec-loader") for t in threading.enumerate())
        and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    assert not any(t.name.startswith("shardrec-loader") for t in threading.enumerate())
    assert sum(1 for _ in loader) == len(loader)  # a new iter() starts the epoch over


def test_set_epoch_during_iteration_ends_the_stale_iterator(data: Path):
    (loader,) = _loaders(data, 1, num_workers=1)
    it = iter(loader)
    next(it)
    loader.set_epoch(1)
    assert list(it) == []
    assert loader.state_dict()["epoch"] == 1 and loader.state_dict()["sample_offset"] == 0


def test_float16_dense_columns_arrive_as_float32(tmp_path: Path):
    from dataset_writing import write_dataset

    rng = np.random.default_rng(0)
    dense = rng.normal(size=(32, 3)).astype(np.float16)
    part = (np.zeros(32, np.uint8), dense, {"a": np.arange(32, dtype=np.uint8)})
    write_dataset(tmp_path, ["x", "y", "z"], {"a": 32}, {"train": [part]}, "float16")
    batch = build_loader(
        tmp_path, "train", global_batch_size=8, rank=1, world_size=2, shuffle=NO_SHUFFLE
    ).batch(1)
    assert batch.dense_features.dtype == torch.float32
    assert np.array_equal(batch.dense_features.numpy(), dense[12:16].astype(np.float32))
    assert batch.sparse_features["a"].values().tolist() == [12, 13, 14, 15]
