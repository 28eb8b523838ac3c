from pathlib import Path

import numpy as np
import pytest

from shardrec.dataloader.format import DatasetError, Manifest, open_split, smallest_uint, verify
from conftest import write_tiny_dataset


def test_smallest_uint_picks_the_narrowest_type():
    assert smallest_uint(255) == np.uint8
    assert smallest_uint(256) == np.uint16
    assert smallest_uint(2**32 - 1) == np.uint32
    assert smallest_uint(2**32) == np.uint64


def test_round_trip_one_hot_and_multi_hot(tmp_path: Path):
    manifest = write_tiny_dataset(tmp_path, multi_hot=("f1",))
    loaded = Manifest.load(tmp_path)
    assert loaded == manifest
    parts = open_split(tmp_path, "train")
    assert [p.rows for p in parts] == [600, 400]
    assert parts[0].offsets["f1"][-1] == len(parts[0].sparse["f1"])
    assert parts[0].sparse["f0"].dtype == np.uint8 and parts[0].sparse["f3"].dtype == np.uint16
    assert verify(tmp_path) == []


def test_not_a_dataset_names_the_directory(tmp_path: Path):
    with pytest.raises(DatasetError, match=f"{tmp_path}: not a shardrec dataset"):
        Manifest.load(tmp_path)


def test_truncated_column_is_caught_at_open(tmp_path: Path):
    write_tiny_dataset(tmp_path)
    victim = tmp_path / "train" / "part-00001" / "dense.npy"
    victim.write_bytes(victim.read_bytes()[:-16])
    with pytest.raises(DatasetError, match="part-00001/dense.npy: .* bytes on disk, manifest says"):
        open_split(tmp_path, "train")
    assert any("part-00001/dense.npy" in p for p in verify(tmp_path))
