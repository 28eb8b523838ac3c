"""`shardrec data import-npy` on arrays it must not import, and into an --out it must not
overwrite: one line naming the file, row, column and value (or the flag as typed), exit 1, and
nothing under --out that looks like a dataset."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_one_line_error, cli

from shardrec.dataloader.format.manifest import Manifest

ROWS = (120, 90)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """Two small days in torchrec's layout: int32 ids below 50, labels 0 or 1."""
    src = tmp_path / "npy"
    src.mkdir()
    rng = np.random.default_rng(0)
    for day, rows in enumerate(ROWS):
        np.save(src / f"day_{day}_dense.npy", rng.random((rows, 13), dtype=np.float32))
        np.save(src / f"day_{day}_sparse.npy", rng.integers(0, 50, (rows, 26)).astype(np.int32))
        np.save(src / f"day_{day}_labels.npy", rng.integers(0, 2, (rows, 1)).astype(np.int32))
    return src


def _change(path: Path, edit) -> None:
    array = np.load(path)
    edit(array)
    np.save(path, array)


def _refused(src: Path, out: Path, pattern: str, *flags: str) -> None:
    """import-npy SRC --out OUT FLAGS fails with one line matching `pattern`, leaving OUT new or
    empty and no temporary folder beside it."""
    assert_one_line_error(cli("data", "import-npy", src, "--out", out, *flags, ok=False), pattern)
    assert not out.exists() or not any(out.iterdir()), sorted(out.rglob("*"))
    assert not list(out.parent.glob(f".{out.name}*")), "a temporary folder was left beside --out"


def _file(src: Path, name: str) -> str:
    return re.escape(str(src / name))


def test_a_label_other_than_0_or_1_is_refused_naming_file_row_and_value(src: Path, tmp_path: Path):
    _change(src / "day_0_labels.npy", lambda a: a.__setitem__((100, 0), 2))
    _refused(
        src,
        tmp_path / "out",
        rf"^error: {_file(src, 'day_0_labels.npy')}: row 100: label 2; labels must be 0 or 1$",
    )


def test_an_out_holding_a_dataset_is_refused_and_left_as_it_was(src: Path, tmp_path: Path):
    out = tmp_path / "data"
    cli("data", "import-npy", src, "--out", out, "--max-ids", "97")
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    refused = cli("data", "import-npy", src, "--out", out, "--max-ids", "7", ok=False)
    assert_one_line_error(
        refused, rf"^error: {re.escape(str(out))}: exists and is not an empty directory; "
        "choose a new --out$"
    )  # fmt: skip
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before
    assert Manifest.load(out).sparse_features[0].cardinality == 97
    assert not list(tmp_path.glob(".data*"))
    # An empty directory (made ready by the user) is a new output.
    (tmp_path / "empty").mkdir()
    cli("data", "import-npy", src, "--out", tmp_path / "empty", "--max-ids", "7")
    assert Manifest.load(tmp_path / "empty").splits["train"].rows == ROWS[0]


def test_a_day_with_other_columns_is_refused_naming_the_file_and_both_shapes(
    src: Path, tmp_path: Path
):
    np.save(src / "day_1_dense.npy", np.load(src / "day_1_dense.npy")[:, :12])  # one column short
    _refused(
        src,
        tmp_path / "out",
        rf"^error: {_file(src, 'day_1_dense.npy')}: shape \(90, 12\), expected \(90, 13\) "
        r"\(day_0_dense\.npy has 13 columns; every day needs the same columns\)$",
    )


def test_a_negative_id_is_refused_naming_file_row_column_and_value(src: Path, tmp_path: Path):
    _change(src / "day_1_sparse.npy", lambda a: a.__setitem__((7, 3), -5))
    _refused(
        src,
        tmp_path / "out",
        rf"^error: {_file(src, 'day_1_sparse.npy')}: row 7, column 3 \(C4\): id -5 is negative; ",
    )


@pytest.mark.parametrize(
    "flag, says",
    [
        ("0", "table rows must be positive, got 0"),
        ("10,-1", "table rows must be positive, got -1"),
        ("10,20", "2 values for 26 sparse features; give one for all or one per feature"),
        ("10,x", "expected an integer or a comma-separated list of integers"),
    ],
)
def test_a_bad_max_ids_names_the_flag_as_typed(src: Path, tmp_path: Path, flag: str, says: str):
    _refused(
        src, tmp_path / "out", rf"^error: --max-ids {flag}: {re.escape(says)}$", "--max-ids", flag
    )


def test_verify_says_how_to_repair_an_imported_dataset_and_that_repairs_it(
    src: Path, tmp_path: Path
):
    def files(directory: Path) -> dict:
        return {
            p.relative_to(directory): p.read_bytes() for p in directory.rglob("*") if p.is_file()
        }

    out = tmp_path / "data"
    cli("data", "import-npy", src, "--out", out, "--max-ids", "97")
    before = files(out)
    part = sorted((out / "train").glob("*.arrow"))[0]
    part.write_bytes(part.read_bytes()[:-10])
    verify = cli("data", "verify", out, ok=False)
    # Before, it said to rerun `shardrec preprocess` into it, which import-npy's folder is not.
    assert (verify.exit_code, verify.stdout.splitlines()[1:]) == (
        1,
        [
            f"to repair {out}, import it again into a new folder: `shardrec data import-npy SRC "
            "--out NEW`"
        ],
    )
    cli("data", "import-npy", src, "--out", tmp_path / "new", "--max-ids", "97")
    assert files(tmp_path / "new") == before
