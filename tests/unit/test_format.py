import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import write_tiny_dataset
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.dataloader.format.integrity import verify
from shardrec.dataloader.format.manifest import DatasetError, Manifest, SparseFeature, smallest_uint
from shardrec.dataloader.format.part_file import manifest_layout, open_split
from shardrec.tools.cli.app import app

runner = CliRunner()


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


def test_truncated_part_file_is_caught_at_open_and_by_verify(tmp_path: Path):
    write_tiny_dataset(tmp_path)
    victim = tmp_path / "train" / "part-00001.arrow"
    victim.write_bytes(victim.read_bytes()[:-16])
    with pytest.raises(DatasetError, match="part-00001.arrow: .* bytes on disk, manifest says"):
        open_split(tmp_path, "train")
    assert any("part-00001.arrow" in p for p in verify(tmp_path))


def _edit_manifest(directory: Path, edit) -> None:
    path = directory / "manifest.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))


def test_a_part_of_other_columns_than_the_manifests_is_refused_naming_the_file(tmp_path: Path):
    write_tiny_dataset(tmp_path)
    _edit_manifest(tmp_path, lambda raw: raw["sparse_features"].pop(2))
    with pytest.raises(
        DatasetError,
        match=r"train/part-00000.arrow: not the part the manifest describes: its columns "
        r"\(names, types\) or their metadata are not the manifest's",
    ):
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
            lambda raw: raw["splits"]["train"]["parts"][1].update(rows="10"),
            r"splits.train.parts\[1\].rows is '10', expected an integer >= 0",
        ),
        (
            lambda raw: raw["splits"]["train"]["parts"][1].update(files={}),
            r"splits.train.parts\[1\] lists files \(the layout of schema versions 1 and 2\)",
        ),
    ],
)
def test_malformed_splits_are_dataset_errors(tmp_path: Path, edit, message):
    write_tiny_dataset(tmp_path, rows={"train": [10, 10], "val": [5], "test": [5]})
    _edit_manifest(tmp_path, edit)
    with pytest.raises(DatasetError, match=message):
        Manifest.load(tmp_path)


def _offsets_at(directory: Path, feature: str) -> int:
    """Where feature's offsets lie in train part 0's file."""
    manifest = Manifest.load(directory)
    layout = manifest_layout(manifest)
    info = manifest.splits["train"].parts[0]
    column = [c.name for c in layout.columns].index(feature)
    sizes = layout.sizes(info.rows, [int(open_split(directory, "train")[0].offsets[feature][-1])])
    return layout.body_at + sizes.buffers[layout.offsets_buffer[column]][0]


def test_list_offsets_are_checked_against_rows_and_ids(tmp_path: Path):
    write_tiny_dataset(tmp_path, rows={"train": [30]}, multi_hot=("f1",))
    path = tmp_path / "train" / "part-00000.arrow"
    ids = int(open_split(tmp_path, "train")[0].offsets["f1"][-1])
    at = _offsets_at(tmp_path, "f1")
    good = path.read_bytes()
    for where, value, message in (
        (0, 1, f"offsets run from 1 to {ids}, expected 0 to {ids}"),
        (30, ids - 1, f"offsets run from 0 to {ids - 1}, expected 0 to {ids}"),
    ):
        bad = bytearray(good)  # same size: only the values are wrong
        bad[at + 8 * where : at + 8 * where + 8] = np.int64(value).tobytes()
        path.write_bytes(bytes(bad))
        with pytest.raises(DatasetError, match=f"part-00000.arrow: column f1: {message}"):
            open_split(tmp_path, "train")
    bad = bytearray(good)
    bad[at + 8 * 10 : at + 8 * 11] = np.int64(ids).tobytes()  # a row's end past the next row's
    path.write_bytes(bytes(bad))
    sha = hashlib.sha256(bytes(bad)).hexdigest()  # as a careless tool would record it
    _edit_manifest(tmp_path, lambda raw: raw["splits"]["train"]["parts"][0].update(sha256=sha))
    open_split(tmp_path, "train")  # opening checks the ends only; verify reads them all
    assert any("column f1: offsets decrease at row 10" in p for p in verify(tmp_path))


def test_the_old_layout_is_refused_naming_the_upgrade_and_other_versions_are_refused(
    tmp_path: Path,
):
    manifest = write_tiny_dataset(tmp_path, multi_hot=("f1",))
    plain = json.loads(manifest.to_json())
    assert plain["schema_version"] == 3 and all(
        "pooling" not in f for f in plain["sparse_features"]
    )
    manifest.sparse_features[1].pooling = "mean"
    manifest.save(tmp_path)
    written = json.loads((tmp_path / "manifest.json").read_text())
    assert written["sparse_features"][1]["pooling"] == "mean"
    assert Manifest.load(tmp_path) == manifest
    for old in (1, 2):
        (tmp_path / "manifest.json").write_text(json.dumps({**written, "schema_version": old}))
        with pytest.raises(
            DatasetError,
            match=f"schema_version {old}, the layout of a folder of .npy files per part, .*"
            f"`shardrec data upgrade {tmp_path}`",
        ):
            Manifest.load(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({**written, "schema_version": 4}))
    with pytest.raises(
        DatasetError,
        match="schema_version 4 is not supported .this shardrec reads 3, and upgrades 1 and 2.",
    ):
        Manifest.load(tmp_path)
    written["sparse_features"][1]["pooling"] = "max"
    (tmp_path / "manifest.json").write_text(json.dumps(written))
    with pytest.raises(
        DatasetError, match=r"sparse_features\[1\].pooling is 'max', expected sum or mean"
    ):
        Manifest.load(tmp_path)


def _load_refusal(directory: Path) -> str:
    with pytest.raises(DatasetError) as caught:
        Manifest.load(directory)
    return str(caught.value)


def test_a_folder_without_a_manifest_says_why_in_one_line(tmp_path: Path):
    """Not a dataset, a dataset preprocessing is writing now, or one whose preprocessing stopped:
    each says what to do."""
    from shardrec.dataloader.util import locks

    assert _load_refusal(tmp_path) == (
        f"{tmp_path}: not a shardrec dataset (no manifest.json); create one with "
        "`shardrec preprocess`"
    )
    (tmp_path / ".work").mkdir()
    assert _load_refusal(tmp_path) == (
        f"{tmp_path}: preprocessing did not finish (no manifest.json; .work/ holds its finished "
        "tasks); rerun the same `shardrec preprocess` command to complete it"
    )
    fd = locks.hold(
        tmp_path / ".work" / "lock", {"command": "shardrec preprocess", "host": "h", "pid": 7}
    )
    try:
        assert _load_refusal(tmp_path) == (
            f"{tmp_path}: being written by shardrec preprocess on host h, pid 7 (no "
            "manifest.json yet); wait for it to finish"
        )
    finally:
        os.close(fd)
    assert _load_refusal(tmp_path / "nowhere") == f"{tmp_path / 'nowhere'}: does not exist"
    (tmp_path / "file").write_text("")
    assert _load_refusal(tmp_path / "file") == f"{tmp_path / 'file'}: not a directory"


def test_a_manifest_of_another_format_or_unreadable_is_refused_naming_it(tmp_path: Path):
    write_tiny_dataset(tmp_path, rows={"train": [10]})
    path = tmp_path / "manifest.json"
    assert json.loads(path.read_text())["format"] == "shardrec-dataset"
    _edit_manifest(tmp_path, lambda raw: raw.update(format="other"))
    assert _load_refusal(tmp_path) == (f"{path}: format is 'other', expected 'shardrec-dataset'")
    path.write_text("{")
    assert _load_refusal(tmp_path).startswith(f"{path}: unreadable manifest: ")


def test_a_part_listed_twice_in_its_split_is_refused_in_one_line(tmp_path: Path):
    """A part's entry repeated (its rows added to the split's count, as a hand edit would) made
    every reader read its rows twice an epoch, and `data verify` pass."""
    write_tiny_dataset(tmp_path, rows={"train": [600, 400]})

    def repeat(raw):
        parts = raw["splits"]["train"]["parts"]
        parts.append(dict(parts[1]))
        raw["splits"]["train"]["rows"] += parts[1]["rows"]

    _edit_manifest(tmp_path, repeat)
    line = (
        f"{tmp_path / 'manifest.json'}: part 'part-00001.arrow' of split 'train' is listed twice, "
        "so its rows would be read twice an epoch; re-run the command that made the dataset, "
        "into it, to write its manifest again"
    )
    assert _load_refusal(tmp_path) == line
    for command in ("verify", "digest", "head"):
        assert_one_line_error(runner.invoke(app, ["data", command, str(tmp_path)]), re.escape(line))


def test_a_split_counts_the_rows_of_its_parts(tmp_path: Path):
    manifest = write_tiny_dataset(tmp_path, rows={"train": [600, 400], "val": [256]})
    loaded = Manifest.load(tmp_path)
    assert loaded.splits["train"].rows == 1000 and loaded.splits["val"].rows == 256
    assert loaded.feature_names == ["f0", "f1", "f2", "f3"] == manifest.feature_names


def _open_refusal(directory: Path, split: str = "train") -> str:
    with pytest.raises(DatasetError) as caught:
        open_split(directory, split)
    return str(caught.value)


def test_a_missing_part_file_and_one_that_leads_out_of_the_dataset_are_refused(tmp_path: Path):
    data = tmp_path / "data"
    write_tiny_dataset(data, rows={"train": [10]})
    part = data / "train" / "part-00000.arrow"
    outside = tmp_path / "elsewhere.arrow"
    outside.write_bytes(part.read_bytes())
    part.unlink()
    assert _open_refusal(data) == f"{part}: missing (named by {data / 'manifest.json'})"
    part.symlink_to(outside)  # same bytes, outside the dataset
    assert _open_refusal(data) == (
        f"{part}: leads out of the dataset directory {data.resolve()} (a symlink to "
        f"{outside.resolve()}); named by {data / 'manifest.json'}"
    )


def test_the_cheap_check_of_a_part_finds_a_truncated_or_missing_file(tmp_path: Path):
    """What the loader checks of every part when it opens a split, before mapping any."""
    from shardrec.dataloader.format.part_file import check_part_file

    manifest = write_tiny_dataset(tmp_path, rows={"train": [10]})
    info = manifest.splits["train"].parts[0]
    check_part_file(tmp_path, "train", info)
    part = tmp_path / "train" / "part-00000.arrow"
    part.write_bytes(part.read_bytes()[:-4])
    with pytest.raises(DatasetError) as caught:
        check_part_file(tmp_path, "train", info)
    assert str(caught.value) == (
        f"{part}: {info.bytes - 4} bytes on disk, manifest says {info.bytes} (truncated or "
        f"replaced?); `shardrec data verify {tmp_path}` names every changed file and how to write "
        "it again (or restore the file from a copy)"
    )
    part.unlink()
    with pytest.raises(DatasetError, match=r"part-00000.arrow: missing \(named by"):
        check_part_file(tmp_path, "train", info)


def test_a_part_entry_without_its_checksum_or_with_the_old_files_says_so(tmp_path: Path):
    write_tiny_dataset(tmp_path, rows={"train": [10]})
    _edit_manifest(tmp_path, lambda raw: raw["splits"]["train"]["parts"][0].pop("sha256"))
    assert _load_refusal(tmp_path) == (
        f"{tmp_path / 'manifest.json'}: malformed manifest: splits.train.parts[0].sha256 is None, "
        "expected a string"
    )
    _edit_manifest(
        tmp_path, lambda raw: raw["splits"]["train"]["parts"][0].update(sha256="0", files={})
    )
    assert _load_refusal(tmp_path) == (
        f"{tmp_path / 'manifest.json'}: malformed manifest: splits.train.parts[0] lists files "
        "(the layout of schema versions 1 and 2)"
    )


def test_a_part_name_that_leads_out_of_the_dataset_is_refused_in_one_line(tmp_path: Path):
    write_tiny_dataset(tmp_path, rows={"train": [10]})
    _edit_manifest(tmp_path, lambda raw: raw["splits"]["train"]["parts"][0].update(name="../x"))
    assert _load_refusal(tmp_path) == (
        f"{tmp_path / 'manifest.json'}: part '../x' of split 'train' is not a plain name inside "
        "the dataset directory"
    )


def test_writing_a_part_again_replaces_it_and_mismatched_columns_are_refused(tmp_path: Path):
    """A rerun of a preprocessing task writes its part over the one a killed run left."""
    import pyarrow as pa

    from shardrec.dataloader.format.part_file import file_layout, write_part

    layout = file_layout(["d0", "d1"], "float32", [SparseFeature("f0", 10, "uint8")])
    part = tmp_path / "train" / "part-00000.arrow"
    ids = {"f0": np.arange(4, dtype=np.uint8)}
    write_part(part, layout, np.zeros(4, np.uint8), np.zeros((4, 2), np.float32), ids)
    info = write_part(part, layout, np.ones(4, np.uint8), np.ones((4, 2), np.float32), ids)
    table = pa.ipc.open_file(str(part)).read_all()
    assert table.column("label").to_pylist() == [1, 1, 1, 1] and info.rows == 4
    assert sorted(p.name for p in part.parent.iterdir()) == ["part-00000.arrow"]
    with pytest.raises(ValueError, match=r"^dense has 3 rows, labels 4$"):
        write_part(part, layout, np.ones(4, np.uint8), np.ones((3, 2), np.float32), ids)
    assert pa.ipc.open_file(str(part)).read_all().equals(table)  # the refusal wrote nothing


def test_multi_hot_offsets_refusals_are_whole_lines(tmp_path: Path):
    write_tiny_dataset(tmp_path, rows={"train": [30]}, multi_hot=("f1",))
    path = tmp_path / "train" / "part-00000.arrow"
    ids = int(open_split(tmp_path, "train")[0].offsets["f1"][-1])
    at = _offsets_at(tmp_path, "f1")
    bad = bytearray(path.read_bytes())
    bad[at : at + 8] = np.int64(1).tobytes()
    path.write_bytes(bytes(bad))
    advice = (
        f"; `shardrec data verify {tmp_path}` names every changed file and how to write it again "
        "(or restore the file from a copy)"
    )
    assert _open_refusal(tmp_path) == (
        f"{path}: column f1: offsets run from 1 to {ids}, expected 0 to {ids} (the column's ids)"
        + advice
    )
    # the part's count and the split's edited alike (the split's alone is refused on loading)
    _edit_manifest(tmp_path, lambda raw: raw["splits"]["train"].update(rows=31))
    _edit_manifest(tmp_path, lambda raw: raw["splits"]["train"]["parts"][0].update(rows=31))
    assert _open_refusal(tmp_path) == f"{path}: holds 30 rows, manifest says 31" + advice


def _list_and_one_hot_part(path: Path):
    """A part whose one-hot feature is named like another's offsets ("b/offsets" beside list "b")."""
    from shardrec.dataloader.format.part_file import PartInfo, file_layout, map_part, write_part

    features = [
        SparseFeature("b/offsets", 1000, "uint64"),
        SparseFeature("b", 1000, "uint64", True),
    ]
    layout = file_layout(["d0"], "float32", features)
    rows = 5
    one_hot = np.array([900, 901, 902, 903, 904], np.uint64)
    offsets = np.array([0, 1, 3, 3, 4, 6], np.int64)
    info = write_part(
        path,
        layout,
        np.ones(rows, np.uint8),
        np.zeros((rows, 1), np.float32),
        {"b/offsets": one_hot, "b": np.arange(6, dtype=np.uint64)},
        {"b": offsets},
    )
    return map_part(str(path), PartInfo(path.name, rows, info.bytes, info.sha256), layout), one_hot


def test_a_part_records_each_columns_own_address(tmp_path: Path) -> None:
    # The several-parts kernels read a column by the address its part's opening recorded: a
    # feature named like another's offsets must not get the offsets' address (its ids would read
    # as 0, 1, 3, ...: in bounds, a wrong batch).
    part, one_hot = _list_and_one_hot_part(tmp_path / "part-00000.arrow")
    for name, column in [("label", part.labels), ("dense", part.dense), *part.sparse.items()]:
        assert part.column_address(name, column) == column.ctypes.data, name
    offsets = part.offsets["b"]
    assert part.column_address("b", offsets, offsets=True) == offsets.ctypes.data
    address = part.column_address("b/offsets", part.sparse["b/offsets"])
    assert (
        np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint64 * 5).from_address(address)).tolist()
        == one_hot.tolist()
    )


def test_a_part_another_user_owns_is_read_ahead_without_asking_mincore(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # mincore says "all cached" of a file the process neither owns nor may write (Linux >= 5.0):
    # the thread warming the next shuffle group must not trust it there, or it would read nothing
    # ahead of the gathers.
    import shardrec.dataloader.format.part_cache as part_cache
    import shardrec.dataloader.format.part_file as part_file

    manifest = write_tiny_dataset(tmp_path, {"train": [40, 40, 40]})
    asked: list[bool] = []
    monkeypatch.setattr(part_cache, "read_ahead_spans", lambda spans, probe: asked.append(probe))
    part_cache.PartSet(tmp_path, "train", manifest).warm([(1, 0, 40), (2, 0, 40)])
    assert asked == [True, True]  # ours: mincore tells the truth
    monkeypatch.setattr(part_file.os, "geteuid", lambda: 4242)
    monkeypatch.setattr(part_file.os, "access", lambda path, mode: False)
    asked.clear()
    part_cache.PartSet(tmp_path, "train", manifest).warm([(1, 0, 40), (2, 0, 40)])
    assert asked == [False, False]
