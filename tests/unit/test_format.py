import json
from pathlib import Path

import numpy as np
import pytest
from conftest import write_tiny_dataset

from shardrec.dataloader.format.integrity import verify
from shardrec.dataloader.format.manifest import DatasetError, Manifest, open_split, smallest_uint


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


def _edit_manifest(directory: Path, edit) -> None:
    import json

    path = directory / "manifest.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))


def test_part_without_a_feature_column_names_the_part_and_column(tmp_path: Path):
    write_tiny_dataset(tmp_path)
    _edit_manifest(tmp_path, lambda raw: raw["splits"]["train"]["parts"][1]["files"].pop("f2.npy"))
    with pytest.raises(DatasetError, match=r"manifest.json: part train/part-00001 lists no f2.npy"):
        open_split(tmp_path, "train")
    _edit_manifest(
        tmp_path, lambda raw: raw["splits"]["train"]["parts"][0]["files"].pop("label.npy")
    )
    with pytest.raises(DatasetError, match=r"part train/part-00000 lists no label.npy"):
        open_split(tmp_path, "train")


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda raw: raw.update(splits=["train"]),
            r"malformed manifest: splits is \['train'\], expected an object",
        ),
        (
            lambda raw: raw["splits"].update(val=[]),
            r"malformed manifest: splits.val is \[\], expected an object",
        ),
        (
            lambda raw: raw["splits"]["test"].update(parts={}),
            r"malformed manifest: splits.test.parts is \{\}, expected a list",
        ),
        (
            lambda raw: raw["splits"]["train"]["parts"][1].update(files=[]),
            r"splits.train.parts\[1\].files is \[\], expected an object",
        ),
    ],
)
def test_malformed_splits_are_dataset_errors(tmp_path: Path, edit, message):
    write_tiny_dataset(tmp_path, rows={"train": [10, 10], "val": [5], "test": [5]})
    _edit_manifest(tmp_path, edit)
    with pytest.raises(DatasetError, match=message):
        Manifest.load(tmp_path)


def test_multi_hot_offsets_are_checked_against_rows_and_ids(tmp_path: Path):
    write_tiny_dataset(tmp_path, rows={"train": [30]}, multi_hot=("f1",))
    path = tmp_path / "train" / "part-00000" / "f1.offsets.npy"
    good = np.load(path)
    ids = int(good[-1])
    for bad, message in (
        (good + 1, f"offsets run from 1 to {ids + 1}, expected 0 to {ids}"),
        (np.minimum(good, ids - 1), f"offsets run from 0 to {ids - 1}, expected 0 to {ids}"),
    ):
        np.save(path, bad)  # same size: only the values are wrong
        with pytest.raises(DatasetError, match=f"f1.offsets.npy: {message}"):
            open_split(tmp_path, "train")
    np.save(path, good[:-1])
    _edit_manifest(
        tmp_path,
        lambda raw: raw["splits"]["train"]["parts"][0]["files"]["f1.offsets.npy"].update(
            bytes=path.stat().st_size
        ),
    )
    with pytest.raises(
        DatasetError, match=r"f1.offsets.npy: \(30,\) offsets, expected 31 \(rows \+ 1\)"
    ):
        open_split(tmp_path, "train")


def test_list_features_record_their_pooling_under_version_2_and_others_keep_version_1_bytes(
    tmp_path: Path,
):
    manifest = write_tiny_dataset(tmp_path, multi_hot=("f1",))
    plain = json.loads(manifest.to_json())
    assert plain["schema_version"] == 1 and all(
        "pooling" not in f for f in plain["sparse_features"]
    )
    manifest.sparse_features[1].pooling = "mean"
    manifest.schema_version = 2
    manifest.save(tmp_path)
    written = json.loads((tmp_path / "manifest.json").read_text())
    assert written["schema_version"] == 2 and written["sparse_features"][1]["pooling"] == "mean"
    assert Manifest.load(tmp_path) == manifest
    (tmp_path / "manifest.json").write_text(json.dumps({**written, "schema_version": 3}))
    with pytest.raises(
        DatasetError, match="schema_version 3 is not supported .this shardrec reads 1 and 2."
    ):
        Manifest.load(tmp_path)
    written["sparse_features"][1]["pooling"] = "max"
    (tmp_path / "manifest.json").write_text(json.dumps(written))
    with pytest.raises(
        DatasetError, match=r"sparse_features\[1\].pooling is 'max', expected sum or mean"
    ):
        Manifest.load(tmp_path)
