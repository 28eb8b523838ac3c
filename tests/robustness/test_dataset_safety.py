"""Hostile dataset files (README, Failures and trust: Datasets): a column that disagrees with the
manifest, ids outside their table, and part names that lead out of the dataset directory. Each file
is made hostile with its manifest checksum updated to match, as a careless tool or a hostile user
would, so only the checks themselves can catch it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import loader_kwargs, write_tiny_dataset
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.dataloader.format.manifest import DatasetError, file_sha256, shown
from shardrec.dataloader.loader import build_loader
from shardrec.tools.cli.app import app

runner = CliRunner()


def _edit_manifest(directory: Path, edit) -> None:
    path = directory / "manifest.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))


def _replace_column(
    directory: Path, part: str, fname: str, array: np.ndarray, split: str = "train"
) -> Path:
    """Write `array` as one column, and record its size and checksum in the manifest."""
    path = directory / split / part / fname
    np.save(path, array)
    index = int(part.split("-")[1])
    entry = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    _edit_manifest(
        directory, lambda raw: raw["splits"][split]["parts"][index]["files"][fname].update(entry)
    )
    return path


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


@pytest.mark.parametrize(
    "column, array, message",
    [
        (
            "dense.npy",
            lambda a: np.concatenate([a, a], axis=1),
            r"shape \(600, 8\), manifest says \(600, 4\)",
        ),
        ("dense.npy", lambda a: a[:, :2].copy(), r"shape \(600, 2\), manifest says \(600, 4\)"),
        ("dense.npy", lambda a: a.astype(np.float64)[:, :2], r"dtype <f8, manifest says <f4"),
        ("dense.npy", lambda a: np.asfortranarray(a), r"stored in Fortran order"),
        ("f3.npy", lambda a: a.astype(np.uint32), r"dtype <u4, manifest says <u2"),
        ("f3.npy", lambda a: np.stack([a, a], axis=1), r"shape \(600, 2\), manifest says \(600,\)"),
        ("label.npy", lambda a: a.astype(np.float32), r"dtype <f4, manifest says \|u1"),
    ],
    ids=[
        "wider-dense",
        "narrower-dense",
        "float64-dense",
        "fortran-dense",
        "uint32-ids",
        "2d-ids",
        "float-labels",
    ],
)
def test_a_column_that_disagrees_with_the_manifest_is_refused_naming_the_file(
    tmp_path: Path, column, array, message
):
    data = tmp_path / "data"
    write_tiny_dataset(data, rows={"train": [600, 400]})
    path = data / "train" / "part-00000" / column
    _replace_column(data, "part-00000", column, array(np.load(path)))
    pattern = re.escape(str(path)) + ": " + message
    _assert_every_reader_refuses(data, pattern)
    for compiled in (True, False):
        with pytest.raises(DatasetError, match=pattern):
            _read_everything(data, compiled=compiled)


@pytest.mark.parametrize("multi_hot", [False, True], ids=["one-hot", "multi-hot"])
def test_an_id_beyond_its_table_is_refused_naming_file_row_and_id(tmp_path: Path, multi_hot: bool):
    data = tmp_path / "data"
    write_tiny_dataset(data, rows={"train": [600, 400]}, multi_hot=("f3",) if multi_hot else ())
    path = data / "train" / "part-00001" / "f3.npy"  # table f3 has 1,000 rows; its ids are uint16
    ids = np.load(path)
    ids[123] = 65_132  # one changed byte's worth: the README's example id
    _replace_column(data, "part-00001", "f3.npy", ids)
    row = (
        123
        if not multi_hot
        else int(
            np.searchsorted(
                np.load(data / "train" / "part-00001" / "f3.offsets.npy"), 123, side="right"
            )
        )
        - 1
    )
    pattern = re.escape(f"{path}: row {row} has id 65132, outside table f3 of 1000 rows")
    _assert_every_reader_refuses(data, pattern)
    plot = _cli(
        "data", "stats", data, "--plot", tmp_path / "ids.png"
    )  # counts every id of the split
    assert_one_line_error(
        plot,
        re.escape(f"{data}: id 65132 is outside the table of 1000 rows; `shardrec data verify"),
    )
    # every gather path: compiled and numpy, shuffled (rows of both parts) and in file order
    for kw in (
        {},
        {"compiled": False},
        {"shuffle": False},
        {"shuffle": False, "compiled": False},
        {"window_blocks": 1, "block_rows": 4},
    ):
        with pytest.raises(DatasetError, match=pattern):
            _read_everything(data, **kw)
    ids[123] = 999  # the last row of the table is a valid id
    _replace_column(data, "part-00001", "f3.npy", ids)
    assert _cli("data", "verify", data).exit_code == 0
    _read_everything(data)


@pytest.mark.parametrize("multi_hot", [False, True], ids=["one-hot", "multi-hot"])
def test_an_id_equal_to_its_tables_rows_is_the_first_refused(tmp_path: Path, multi_hot: bool):
    """Table f3 has 1,000 rows, ids 0..999: id 1000 is one past the last row, refused by every
    gather path of the loader, as 999 is read."""
    data = tmp_path / "data"
    write_tiny_dataset(data, rows={"train": [600, 400]}, multi_hot=("f3",) if multi_hot else ())
    path = data / "train" / "part-00000" / "f3.npy"
    ids = np.load(path)
    for bad, refused in ((1000, True), (999, False)):
        ids[:] = np.minimum(ids, 998)
        ids[7] = bad
        _replace_column(data, "part-00000", "f3.npy", ids)
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


def _outside_part(tmp_path: Path, data: Path) -> None:
    """A copy of train part 0 outside the dataset directory."""
    (tmp_path / "elsewhere").mkdir()
    (data / "train" / "part-00000").rename(tmp_path / "elsewhere" / "part-00000")


@pytest.mark.parametrize(
    "how", ["dotdot", "absolute", "symlinked-part", "symlinked-file", "dotdot-file"]
)
def test_part_names_that_lead_out_of_the_dataset_are_refused(tmp_path: Path, how: str):
    data = tmp_path / "data"
    write_tiny_dataset(data, rows={"train": [600, 400]})
    _outside_part(tmp_path, data)
    outside = tmp_path / "elsewhere" / "part-00000"
    manifest = re.escape(str(data / "manifest.json"))
    if how == "dotdot":
        _edit_manifest(
            data,
            lambda raw: raw["splits"]["train"]["parts"][0].update(
                name="../../elsewhere/part-00000"
            ),
        )
        pattern = (
            manifest
            + r": part '\.\./\.\./elsewhere/part-00000' of split 'train' is not a plain name"
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
    elif how == "dotdot-file":
        (data / "train" / "part-00000").mkdir()
        _edit_manifest(
            data,
            lambda raw: raw["splits"]["train"]["parts"][0]["files"].update(
                {"../../../elsewhere/part-00000/f0.npy": {"bytes": 1, "sha256": ""}}
            ),
        )
        pattern = (
            manifest
            + r": part train/part-00000 lists file '\.\./\.\./\.\./elsewhere/part-00000/f0\.npy', not a plain name"
        )
    elif how == "symlinked-part":
        (data / "train" / "part-00000").symlink_to(outside)
        pattern = (
            re.escape(str(data / "train" / "part-00000"))
            + r"/\S+\.npy: leads out of the dataset directory"
        )
    else:
        (data / "train" / "part-00000").mkdir()
        for f in outside.iterdir():
            (data / "train" / "part-00000" / f.name).symlink_to(f)
        pattern = (
            re.escape(str(data / "train" / "part-00000"))
            + r"/\S+\.npy: leads out of the dataset directory"
        )
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
        (data / "train" / "part-00000").unlink()
        outside.rename(data / "train" / "real-part-00000")
        (data / "train" / "part-00000").symlink_to(data / "train" / "real-part-00000")
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
