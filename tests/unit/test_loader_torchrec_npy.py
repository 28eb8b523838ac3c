from pathlib import Path

import numpy as np
import pytest
import torch

from shardrec.dataloader.format.manifest import DatasetError
from shardrec.dataloader.loader import NO_SHUFFLE, Delivery, build_loader


def _write_days(
    directory: Path, rows: list[int], num_sparse: int = 3
) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    days = []
    directory.mkdir(parents=True, exist_ok=True)
    for d, n in enumerate(rows):
        day = {
            "dense": rng.normal(size=(n, 13)).astype(np.float32),
            "sparse": rng.integers(0, 2**31 - 1, (n, num_sparse)).astype(np.int32),
            "labels": rng.integers(0, 2, (n, 1)).astype(np.int32),
        }
        for kind, arr in day.items():
            np.save(directory / f"day_{d}_{kind}.npy", arr)
        days.append(day)
    return days


def test_torchrec_days_read_with_torchrec_split_convention(tmp_path: Path):
    days = _write_days(tmp_path, [40, 24, 21])
    train = build_loader(
        tmp_path, "train", global_batch_size=8, rank=1, world_size=2, shuffle=NO_SHUFFLE
    )
    assert train.num_samples == 64 and train.feature_names == ["cat_0", "cat_1", "cat_2"]
    batch = train.batch(5)  # global rows 40..47 = day 1 rows 0..7; rank 1 has rows 4..7
    assert torch.equal(batch.dense_features, torch.from_numpy(days[1]["dense"][4:8]))
    assert batch.labels.tolist() == days[1]["labels"][4:8, 0].astype(np.float32).tolist()
    assert batch.sparse_features["cat_2"].values().tolist() == days[1]["sparse"][4:8, 2].tolist()
    val = build_loader(
        tmp_path, "val", global_batch_size=1, rank=0, world_size=1, shuffle=NO_SHUFFLE
    )
    test = build_loader(
        tmp_path, "test", global_batch_size=1, rank=0, world_size=1, shuffle=NO_SHUFFLE
    )
    assert (val.num_samples, test.num_samples) == (11, 10)  # first ceil(21/2) rows are val
    assert torch.equal(test.batch(0).dense_features[0], torch.from_numpy(days[2]["dense"][11]))


def test_torchrec_raw_ids_fold_into_hash_sizes(tmp_path: Path):
    days = _write_days(tmp_path, [16, 16])
    loader = build_loader(
        tmp_path,
        "train",
        global_batch_size=16,
        rank=0,
        world_size=1,
        shuffle=NO_SHUFFLE,
        hashes=[7, 100, 1000],
    )
    kjt = loader.batch(0).sparse_features
    assert kjt["cat_0"].values().tolist() == (days[0]["sparse"][:, 0] % 7).tolist()
    assert kjt["cat_2"].values().tolist() == (days[0]["sparse"][:, 2] % 1000).tolist()


def test_torchrec_layout_errors_name_the_file(tmp_path: Path):
    _write_days(tmp_path, [16, 16])
    np.save(tmp_path / "day_1_labels.npy", np.zeros((15, 1), np.int32))
    with pytest.raises(DatasetError, match="day_1_labels.npy: 15 rows, day_1_dense.npy has 16"):
        build_loader(tmp_path, "val", global_batch_size=4, rank=0, world_size=1)
    (tmp_path / "day_0_sparse.npy").write_bytes((tmp_path / "day_0_sparse.npy").read_bytes()[:-40])
    with pytest.raises(DatasetError, match="day_0_sparse.npy: unreadable or truncated"):
        build_loader(tmp_path, "train", global_batch_size=4, rank=0, world_size=1)
    (tmp_path / "day_0_sparse.npy").unlink()
    with pytest.raises(DatasetError, match="day_0_sparse.npy: missing"):
        build_loader(tmp_path, "train", global_batch_size=4, rank=0, world_size=1)


@pytest.mark.parametrize(("dtype", "bad"), [(np.int32, -1), (np.int32, 2), (np.float32, 1.5)])
@pytest.mark.parametrize("compiled", [True, False])
def test_a_label_other_than_0_or_1_is_refused_naming_its_row(
    tmp_path: Path, dtype, bad, compiled: bool
):
    """-1 was taken for a padding row (left out of loss and metrics, silently); 1.5 ended in an
    AssertionError."""
    days = _write_days(tmp_path, [16, 16])
    labels = days[0]["labels"].astype(dtype)
    labels[3, 0] = bad
    np.save(tmp_path / "day_0_labels.npy", labels)
    loader = build_loader(
        tmp_path,
        "train",
        global_batch_size=8,
        rank=0,
        world_size=1,
        shuffle=NO_SHUFFLE,
        delivery=Delivery(compiled=compiled),
    )
    with pytest.raises(
        DatasetError, match=f"day_0: column label, row 3 has label {bad}, not 0 or 1"
    ):
        loader.batch(0)
