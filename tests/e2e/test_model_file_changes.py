"""A model file changed after `shardrec export` wrote it (a copy cut short or added to, a byte of
its weights or of its header changed): `shardrec predict` refuses it in one line naming the file
and what to do, never with a traceback and never with other probabilities without a word. The
file as exported scores."""

from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path

import pytest
from conftest import write_tiny_dataset
from helpers import assert_one_line_error, cli

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "run-killed-at-step-6"
"""A run of 2 ranks with one checkpoint, step 4."""
REDO = "export the run again (or copy the file again)"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the fixture's run, its dataset, and its export, model.safetensors."""
    root = tmp_path_factory.mktemp("exported")
    shutil.copytree(FIXTURE, root / "run")
    write_tiny_dataset(root / "data")
    cli("export", root / "run", "--data", root / "data", "--out", root / "model.safetensors")
    return root


def _changed(root: Path, name: str, change) -> Path:
    """A copy of the exported file, its bytes as `change` returns them."""
    path = root / name
    path.write_bytes(change(bytearray((root / "model.safetensors").read_bytes())))
    return path


def _predict(root: Path, model: Path):
    return cli("predict", model, root / "data", "--split", "val", "--out", root / "p.txt", ok=False)


def test_the_model_file_as_exported_scores(root: Path) -> None:
    done = _predict(root, root / "model.safetensors")
    assert done.exit_code == 0, done.output
    assert re.match(r"wrote [\d,]+ probabilities to ", done.stderr), done.stderr


@pytest.mark.parametrize(
    ("name", "change", "size"),
    [("cut.safetensors", lambda b: b[:-100], -100), ("added.safetensors", lambda b: b + b"x", 1)],
)
def test_a_model_file_cut_short_or_added_to_is_refused_in_one_line(
    root: Path, name: str, change, size: int
) -> None:
    # Before: safetensors' traceback, ending "SafetensorError: Error while deserializing header:
    # incomplete metadata, file not fully covered".
    model = _changed(root, name, change)
    whole = (root / "model.safetensors").stat().st_size
    assert_one_line_error(
        _predict(root, model),
        "^"
        + re.escape(
            f"error: {model}: {whole + size:,} bytes, its header describes {whole:,}: the file "
            f"was cut short or added to after export; {REDO}"
        )
        + "$",
    )


def _flip_a_weight(b: bytearray) -> bytearray:
    (size,) = struct.unpack("<Q", b[:8])
    b[8 + size + (len(b) - 8 - size) // 2] ^= 0x40
    return b


def _another_step(b: bytearray) -> bytearray:
    """The header's source step 4 written as 5: as long, JSON still."""
    at = b.index(b'\\"step\\": 4}')
    b[at : at + 12] = b'\\"step\\": 5}'
    return b


@pytest.mark.parametrize(
    ("name", "change"),
    [("weight.safetensors", _flip_a_weight), ("header.safetensors", _another_step)],
)
def test_a_changed_byte_of_a_model_file_is_refused_not_scored(
    root: Path, name: str, change
) -> None:
    # Before: both were scored, exit 0; a byte of a table's weights changed the probabilities of
    # the rows that read its row (2,150 of 12,000 rows of a CSV model, its AUC the same to 6
    # places), with nothing said.
    model = _changed(root, name, change)
    assert_one_line_error(
        _predict(root, model),
        "^"
        + re.escape(
            f"error: {model}: its bytes do not match the sha256 its header records: the file "
            f"changed after export; {REDO}"
        )
        + "$",
    )
