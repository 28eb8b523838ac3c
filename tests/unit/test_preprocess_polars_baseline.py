"""The polars baseline hashes exactly as shardrec does, and the column comparison catches a
difference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardrec.tools.bench.preprocess.polars_pipeline import compare_with_dataset, polars_preprocess
from shardrec.tools.preprocess.ids.id_maps import hash_ids
from shardrec.tools.preprocess.pipeline import PreprocessConfig, run_preprocess

pytest.importorskip("polars")


def _write(path: Path, hexes: list[str]) -> None:
    # One dense column, one hex column: a row per value, every dense edge case on the way.
    dense = ["", "-3", "0", "7", "123456789"]
    path.write_text(
        "".join(f"{i % 2}\t{dense[i % len(dense)]}\t{h}\n" for i, h in enumerate(hexes))
    )


@pytest.mark.parametrize("max_ids", [200, 70_000, 5_000_000_000])  # uint8, uint32, uint64 ids
def test_polars_ids_equal_hash_ids(tmp_path: Path, max_ids: int):
    hexes = ["", "0", "00000000", "ffffffff", "ffffffffffffffff", "80000000", "1", "abcdef12"] * 3
    _write(tmp_path / "t.txt", hexes)
    polars_preprocess(tmp_path / "t.txt", tmp_path / "pl", max_ids, num_dense=1, num_sparse=1)
    values = np.array([int(h, 16) if h else 0 for h in hexes], np.uint64)
    expected = hash_ids(values, np.array([h == "" for h in hexes]), max_ids)
    got = np.load(tmp_path / "pl" / "C1.npy")
    assert (
        got.tolist() == expected.tolist()
        and got.dtype.itemsize == {200: 1, 70_000: 4, 5_000_000_000: 8}[max_ids]
    )
    dense = np.load(tmp_path / "pl" / "dense.npy")
    assert dense.shape == (len(hexes), 1) and dense.dtype == np.float32
    assert (
        dense[:5, 0].tolist()
        == np.log1p(np.array([0, 0, 0, 7, 123456789], np.float64)).astype(np.float32).tolist()
    )


def test_compare_with_dataset_finds_the_column_that_differs(tmp_path: Path):
    from shardrec.tools.preprocess.parse.criteo_text import Schema

    rng = np.random.default_rng(0)
    _write(tmp_path / "t.txt", [f"{v:08x}" if v % 5 else "" for v in rng.integers(0, 2**32, 700)])
    cfg = PreprocessConfig(
        [tmp_path / "t.txt"],
        tmp_path / "ds",
        max_ids=[1000],
        schema=Schema(1, 1, min_fields=3),
        chunk_mb=0.004,
    )
    run_preprocess(cfg)
    polars_preprocess(tmp_path / "t.txt", tmp_path / "pl", 1000, num_dense=1, num_sparse=1)
    assert compare_with_dataset(tmp_path / "ds", tmp_path / "pl") == []
    ids = np.load(tmp_path / "pl" / "C1.npy")
    ids[-1] ^= 1
    np.save(tmp_path / "pl" / "C1.npy", ids)
    assert compare_with_dataset(tmp_path / "ds", tmp_path / "pl") == ["C1"]
    np.save(
        tmp_path / "pl" / "label.npy", np.load(tmp_path / "pl" / "label.npy")[:-1]
    )  # a row short
    assert compare_with_dataset(tmp_path / "ds", tmp_path / "pl") == ["label", "C1"]
