"""Hostile dataset files (README, Failures and trust: Datasets): a part file that disagrees with
the manifest (other columns, a moved buffer, truncated, other rows), a tampered data byte, ids
outside their table, and part names that lead out of the dataset directory. Each file is made
hostile with its manifest size and checksum updated to match, as a careless tool or a hostile
user would, so only the checks themselves can catch it."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import loader_kwargs, write_tiny_dataset
from dataset_writing import change_part_byte, file_offset
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.dataloader.format.dataset_files import file_sha256
from shardrec.dataloader.format.manifest import DatasetError, Manifest, shown
from shardrec.dataloader.format.part_file import (
    file_layout,
    manifest_layout,
    open_split,
    write_part,
)
from shardrec.dataloader.loader import build_loader
from shardrec.tools.cli.app import app

runner = CliRunner()


def _edit_manifest(directory: Path, edit) -> None:
    path = directory / "manifest.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))


def _replace_part(directory: Path, index: int, data: bytes, split: str = "train") -> Path:
    """Write `data` as a part's file, and record its size and checksum in the manifest."""
    path = directory / split / f"part-{index:05d}.arrow"
    path.write_bytes(data)
    entry = {"bytes": len(data), "sha256": file_sha256(path)}
    _edit_manifest(directory, lambda raw: raw["splits"][split]["parts"][index].update(entry))
    return path


def _rewritten(directory: Path, index: int, edit) -> bytes:
    """Part `index` of train written again by shardrec's writer with `edit` applied to its columns
    and layout (dense, sparse, offsets, features): a well-formed file of other columns."""
    manifest = Manifest.load(directory)
    part = open_split(directory, "train", manifest)[index]
    dense, sparse, offsets = np.asarray(part.dense), dict(part.sparse), dict(part.offsets)
    features = [dataclasses.replace(f) for f in manifest.sparse_features]
    dense, sparse, features = edit(dense, sparse, features)
    layout = file_layout([f"d{i}" for i in range(dense.shape[1])], dense.dtype.name, features)
    out = directory.parent / "rewritten.arrow"
    write_part(out, layout, part.labels, dense, sparse, offsets)
    return out.read_bytes()


def _moved_buffer(directory: Path, index: int) -> bytes:
    """Part `index` with one buffer's offset moved in its metadata (the file otherwise valid)."""
    manifest = Manifest.load(directory)
    layout = manifest_layout(manifest)
    data = bytearray(
        (directory / "train" / manifest.splits["train"].parts[index].name).read_bytes()
    )
    at = layout.marks["buffers"] + 16 * layout.values_buffer[-1]  # the last column's ids
    offset = int(np.frombuffer(bytes(data[at : at + 8]), "<i8")[0])
    data[at : at + 8] = np.int64(offset - 8).tobytes()
    return bytes(data)


def _cli(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def _read_everything(directory: Path, **kw) -> None:
    for batch in build_loader(
        directory, "train", **loader_kwargs(global_batch_size=64, rank=0, world_size=1, **kw)
    ):
        assert batch.labels.shape == (64,)


def _assert_every_reader_refuses(data: Path, pattern: str) -> None:
    """What a user runs on a dataset: verify (a problem report on stdout), digest and head (one
    line on stderr), and the loader itself (a DatasetError, with the same message)."""
    verify = _cli("data", "verify", data)
    assert verify.exit_code == 1, verify.output
    assert re.search(pattern, verify.stdout), verify.stdout
    assert_one_line_error(
        _cli("data", "digest", data, "--global-batch", "64", "--batches", "20"), pattern
    )
    assert_one_line_error(_cli("data", "head", data, "-n", "1000"), pattern)


def _every_gather_path_refuses(data: Path, pattern: str) -> None:
    """Compiled and numpy, shuffled (rows of both parts) and in file order, and single rows."""
    for kw in (
        {},
        {"compiled": False},
        {"shuffle": False},
        {"shuffle": False, "compiled": False},
        {"window_blocks": 1, "block_rows": 4},
    ):
        with pytest.raises(DatasetError, match=pattern):
            _read_everything(data, **kw)


def _wider_dense(dense, sparse, features):
    return np.concatenate([dense, dense], axis=1), sparse, features


def _float64_dense(dense, sparse, features):
    return dense.astype(np.float64), sparse, features


def _uint32_ids(dense, sparse, features):
    features[3].dtype = "uint32"
    return dense, {**sparse, "f3": sparse["f3"].astype(np.uint32)}, features


def _fewer_columns(dense, sparse, features):
    return dense, {k: v for k, v in sparse.items() if k != "f2"}, features[:2] + features[3:]


COLUMNS = r"not the part the manifest describes: its columns \(names, types\) or their metadata"


@pytest.mark.parametrize(
    "hostile, message",
    [
        (lambda d: _rewritten(d, 0, _wider_dense), COLUMNS),
        (lambda d: _rewritten(d, 0, _float64_dense), COLUMNS),
        (lambda d: _rewritten(d, 0, _uint32_ids), COLUMNS),
        (lambda d: _rewritten(d, 0, _fewer_columns), COLUMNS),
        (
            lambda d: _moved_buffer(d, 0),
            r"its buffers are not where shardrec writes them for 600 rows",
        ),
        (
            lambda d: (d / "train" / "part-00000.arrow").read_bytes()[:-100],
            r"its footer is not the one shardrec writes",
        ),
        (
            lambda d: (d / "train" / "part-00001.arrow").read_bytes(),
            r"holds 400 rows, manifest says 600",
        ),
    ],
    ids=[
        "wider-dense",
        "float64-dense",
        "uint32-ids",
        "a-column-less",
        "moved-buffer",
        "truncated",
        "other-rows",
    ],
)
def test_a_part_that_disagrees_with_the_manifest_is_refused_naming_the_file(
    tmp_path: Path, hostile, message
):
    data = tmp_path / "data"
    write_tiny_dataset(data, rows={"train": [600, 400]})
    path = _replace_part(data, 0, hostile(data))
    pattern = re.escape(str(path)) + ": .*" + message
    _assert_every_reader_refuses(data, pattern)
    # What to do: verify (whose own report says how to repair, not to run itself), or a copy.
    advice = (
        f"; `shardrec data verify {data}` names every changed file and how to write it again "
        "(or restore the file from a copy)"
    )
    assert_one_line_error(_cli("data", "head", data), pattern + ".*" + re.escape(advice) + "$")
    assert "data verify" not in _cli("data", "verify", data).stdout
    for compiled in (True, False):
        with pytest.raises(DatasetError, match=pattern):
            _read_everything(data, compiled=compiled)


def test_a_tampered_data_byte_is_named_by_verify_and_an_id_it_breaks_by_every_reader(
    tmp_path: Path,
):
    """A changed byte inside a column keeps the file's layout: opening cannot see it. `verify`
    names the file by its checksum; an id it pushes past its table is refused as it is read."""
    data = tmp_path / "data"
    write_tiny_dataset(data, rows={"train": [600, 400]})
    dense = open_split(data, "train")[1].dense
    path = change_part_byte(data, "train", 1, file_offset(dense) + 3, record=False)
    verify = _cli("data", "verify", data)
    assert verify.exit_code == 1 and f"{path}: checksum differs from the manifest" in verify.stdout
    _read_everything(data)  # a dense value: only the checksum tells


def test_a_label_other_than_0_or_1_is_refused_naming_file_and_row(tmp_path: Path):
    """A changed byte in the label column (its checksum recorded) would train as a label of 7:
    every reader refuses it as it refuses an id outside its table, on every gather path."""
    data = tmp_path / "data"
    write_tiny_dataset(data, rows={"train": [600, 400]})
    at = file_offset(open_split(data, "train")[1].labels) + 77
    raw = bytearray((data / "train" / "part-00001.arrow").read_bytes())
    raw[at] = 7
    path = _replace_part(data, 1, bytes(raw))
    pattern = re.escape(f"{path}: column label, row 77 has label 7, not 0 or 1")
    _assert_every_reader_refuses(data, pattern)
    _every_gather_path_refuses(data, pattern)
    raw[at] = 1
    _replace_part(data, 1, bytes(raw))
    assert _cli("data", "verify", data).exit_code == 0
    _read_everything(data)


@pytest.mark.parametrize(
    "edit, stated",
    [
        (lambda split: split.update(rows=1200), 1200),  # the split's count raised by hand
        (lambda split: split["parts"].pop(1), 1000),  # a part's entry dropped, its count kept
    ],
    ids=["count-raised", "part-dropped"],
)
def test_a_split_count_other_than_its_parts_rows_is_refused_in_one_line(
    tmp_path: Path, edit, stated: int
):
    """train sizes an epoch by the split's count and reads the parts: a count other than the
    parts' rows would train more or fewer steps an epoch than the data holds."""
    data = tmp_path / "data"
    write_tiny_dataset(data, rows={"train": [600, 400]})
    _edit_manifest(data, lambda raw: edit(raw["splits"]["train"]))
    held = 1000 if stated == 1200 else 600
    line = re.escape(
        f"{data / 'manifest.json'}: malformed manifest: splits.train.rows is {stated}, "
        f"but its parts hold {held} rows"
    )
    assert_one_line_error(_cli("data", "verify", data), line)
    assert_one_line_error(_cli("data", "stats", data), line)


@pytest.mark.parametrize("multi_hot", [False, True], ids=["one-hot", "multi-hot"])
def test_an_id_beyond_its_table_is_refused_naming_file_row_and_id(tmp_path: Path, multi_hot: bool):
    data = tmp_path / "data"
    write_tiny_dataset(data, rows={"train": [600, 400]}, multi_hot=("f3",) if multi_hot else ())
    part = open_split(data, "train")[1]
    ids = part.sparse["f3"]  # table f3 has 1,000 rows; its ids are uint16
    # one changed id (its bytes rewritten in place, the checksum recorded): the README's example
    at = file_offset(ids) + 2 * 123
    raw = bytearray((data / "train" / "part-00001.arrow").read_bytes())
    raw[at : at + 2] = np.uint16(65_132).tobytes()
    path = _replace_part(data, 1, bytes(raw))
    row = 123 if not multi_hot else int(np.searchsorted(part.offsets["f3"], 123, side="right")) - 1
    del part, ids
    pattern = re.escape(f"{path}: column f3, row {row} has id 65132, outside table f3 of 1000 rows")
    _assert_every_reader_refuses(data, pattern)
    plot = _cli(
        "data", "stats", data, "--plot", tmp_path / "ids.png"
    )  # counts every id of the split
    assert_one_line_error(
        plot,
        re.escape(f"{data}: id 65132 is outside the table of 1000 rows; `shardrec data verify"),
    )
    _every_gather_path_refuses(data, pattern)
    raw[at : at + 2] = np.uint16(999).tobytes()  # the last row of the table is a valid id
    _replace_part(data, 1, bytes(raw))
    assert _cli("data", "verify", data).exit_code == 0
    _read_everything(data)


@pytest.mark.parametrize("value", [-3, 10**6], ids=["negative", "past the ids"])
def test_a_list_offset_out_of_order_is_refused_naming_file_and_row(tmp_path: Path, value: int):
    # Opening checks a list's first and last offsets only. A middle one gone negative was read
    # silently (row 5 got the part's last 3 ids and its first 10: numpy's take wraps the index);
    # one past the ids ended in a raw numpy error naming no file.
    data = tmp_path / "data"
    write_tiny_dataset(data, rows={"train": [600, 400]}, multi_hot=("f3",))
    offsets = open_split(data, "train")[1].offsets["f3"]
    at = file_offset(offsets) + 8 * 6  # the end of row 5, the start of row 6
    del offsets
    raw = bytearray((data / "train" / "part-00001.arrow").read_bytes())
    raw[at : at + 8] = np.int64(value).tobytes()
    path = _replace_part(data, 1, bytes(raw))
    # (row 5 ends there, row 6 begins there: the first read is named)
    pattern = (
        re.escape(f"{path}: column f3, row ") + r"[56] has offsets -?\d+ to -?\d+, not in order"
    )
    _every_gather_path_refuses(data, pattern)
    head = re.escape(f"{path}: column f3, row 5 has offsets")  # row 5 of part 1: the 606th
    assert_one_line_error(_cli("data", "head", data, "-n", "606"), head)


@pytest.mark.parametrize("multi_hot", [False, True], ids=["one-hot", "multi-hot"])
def test_an_id_equal_to_its_tables_rows_is_the_first_refused(tmp_path: Path, multi_hot: bool):
    """Table f3 has 1,000 rows, ids 0..999: id 1000 is one past the last row, refused by every
    gather path of the loader, as 999 is read."""
    data = tmp_path / "data"
    write_tiny_dataset(data, rows={"train": [600, 400]}, multi_hot=("f3",) if multi_hot else ())
    ids = open_split(data, "train")[0].sparse["f3"]
    at, count = file_offset(ids), len(ids)
    raw = bytearray((data / "train" / "part-00000.arrow").read_bytes())
    for bad, refused in ((1000, True), (999, False)):
        column = np.minimum(np.frombuffer(bytes(raw[at : at + 2 * count]), np.uint16), 998)
        column[7] = bad
        raw[at : at + 2 * count] = column.tobytes()
        _replace_part(data, 0, bytes(raw))
        for kw in (
            {},
            {"compiled": False},
            {"shuffle": False},
            {"shuffle": False, "compiled": False},
        ):
            if refused:
                with pytest.raises(
                    DatasetError, match=r"has id 1000, outside table f3 of 1000 rows"
                ):
                    _read_everything(data, **kw)
            else:
                _read_everything(data, **kw)


def _outside_part(tmp_path: Path, data: Path) -> Path:
    """Train part 0's file moved outside the dataset directory."""
    (tmp_path / "elsewhere").mkdir()
    outside = tmp_path / "elsewhere" / "part-00000.arrow"
    (data / "train" / "part-00000.arrow").rename(outside)
    return outside


@pytest.mark.parametrize(
    "how", ["dotdot", "absolute", "not-a-part-file", "symlinked-part", "symlinked-split"]
)
def test_part_names_that_lead_out_of_the_dataset_are_refused(tmp_path: Path, how: str):
    data = tmp_path / "data"
    write_tiny_dataset(data, rows={"train": [600, 400]})
    outside = _outside_part(tmp_path, data)
    manifest = re.escape(str(data / "manifest.json"))
    if how == "dotdot":
        _edit_manifest(
            data,
            lambda raw: raw["splits"]["train"]["parts"][0].update(
                name="../../elsewhere/part-00000.arrow"
            ),
        )
        pattern = (
            manifest
            + r": part '\.\./\.\./elsewhere/part-00000\.arrow' of split 'train' is not a plain name"
        )
    elif how == "absolute":
        _edit_manifest(
            data, lambda raw: raw["splits"]["train"]["parts"][0].update(name=str(outside))
        )
        # a long value is cut to 80 characters, with its length
        pattern = (
            manifest
            + ": part "
            + re.escape(shown(str(outside)))
            + " of split 'train' is not a plain name"
        )
    elif how == "not-a-part-file":
        _edit_manifest(
            data, lambda raw: raw["splits"]["train"]["parts"][0].update(name="manifest.json")
        )
        pattern = manifest + r": part 'manifest\.json' of split 'train' is not a \.arrow file"
    elif how == "symlinked-part":
        (data / "train" / "part-00000.arrow").symlink_to(outside)
        pattern = (
            re.escape(str(data / "train" / "part-00000.arrow"))
            + r": leads out of the dataset directory"
        )
    else:
        (data / "train").rename(tmp_path / "elsewhere" / "train")
        outside.rename(tmp_path / "elsewhere" / "train" / "part-00000.arrow")
        (data / "train").symlink_to(tmp_path / "elsewhere" / "train")
        pattern = re.escape(str(data / "train")) + r"/part-0000\d\.arrow: leads out of the dataset"
    for result in (
        _cli("data", "digest", data, "--global-batch", "64"),
        _cli("data", "head", data),
    ):
        assert_one_line_error(result, pattern)
    verify = _cli("data", "verify", data)
    assert verify.exit_code == 1
    assert re.search(pattern, verify.stdout + verify.stderr), verify.output
    # a symlink that stays inside the dataset directory is fine
    if how == "symlinked-part":
        (data / "train" / "part-00000.arrow").unlink()
        outside.rename(data / "train" / "real-part-00000.arrow")
        (data / "train" / "part-00000.arrow").symlink_to(data / "train" / "real-part-00000.arrow")
        _read_everything(data)


_TRAINER_LOOKUP = """
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingEnv
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from shardrec.embeddings.optim import attach_fused_optimizer
from shardrec.trainer.model.build import trainer_sharders

ebc = EmbeddingBagCollection(
    tables=[EmbeddingBagConfig(name="t", embedding_dim=4, num_embeddings=100, feature_names=["f"])],
    device=torch.device("meta"),
)
attach_fused_optimizer(ebc, ["t"], optimizer="sgd", lr=1.0, eps=1e-8)
model = DistributedModelParallel(
    ebc,
    env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),
    device=torch.device("cpu"),
    sharders=trainer_sharders(None),
)
for ids in ([3, 99], [3, 150]):
    kjt = KeyedJaggedTensor(keys=["f"], values=torch.tensor(ids), lengths=torch.tensor([1, 1], dtype=torch.int32))
    try:
        model(kjt)["f"].sum().backward()  # the fused optimizer steps in backward: it must still be there
        print("trained", ids, flush=True)
    except RuntimeError as e:
        print("refused", ids, str(e).splitlines()[0], flush=True)
"""


@pytest.mark.slow
def test_the_trainer_refuses_an_id_beyond_its_table_instead_of_training_row_zero(tmp_path: Path):
    """The backstop behind the loader's check: fbgemm's bounds check set to FATAL in the trainer's
    sharders (its default logs "Setting idx to zero" and trains row 0)."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", _TRAINER_LOOKUP, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith(("trained", "refused"))]
    assert lines[:1] == ["trained [3, 99]"], result.stdout + result.stderr[-3000:]
    assert (
        len(lines) == 2 and lines[1].startswith("refused [3, 150]") and "idx < num_rows" in lines[1]
    ), result.stdout + result.stderr[-3000:]
    assert "Setting idx to zero" not in result.stderr
