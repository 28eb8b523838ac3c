"""Index tables for multi-hot ids: equal to the MLPerf reference's algorithm, drawn chunk by
chunk, generated once, resumed after a kill."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import write_tiny_dataset
from multihot_reference import reference_tables

from shardrec.dataloader.multihot import multihot_kernel, table_files
from shardrec.dataloader.multihot import multihot_tables as multihot
from shardrec.dataloader.multihot.multihot_tables import (
    MultiHotSpec,
    multihot_spec,
    open_index_tables,
)

SIZES = [3, 1, 2, 7, 1, 5]
ROWS = [50, 4, 1, 300, 9, 70_000]


# One chunk per id is checked with uniform draws only: pareto at that size is slow and adds nothing.
CASES = [
    (d, c) for d in ("uniform", "pareto") for c in (1, 7, 1000, 1 << 22) if (d, c) != ("pareto", 1)
]


@pytest.mark.parametrize("dist, chunk_ids", CASES)
def test_tables_equal_the_reference_at_any_chunk_size(tmp_path: Path, dist: str, chunk_ids: int):
    # Small chunks cut the big table's rows into many draws: a smaller one keeps that fast.
    spec = MultiHotSpec(
        tuple(SIZES), tuple(ROWS[:-1] + [ROWS[-1] if chunk_ids >= 1000 else 2_000]), dist
    )
    tables = open_index_tables(tmp_path, spec, chunk_ids=chunk_ids)
    expected = reference_tables(list(spec.sizes), list(spec.rows), dist)
    assert len(tables.tables) == len(expected)
    for got, want in zip(tables.tables, expected):
        assert got.dtype == np.int32 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert all(np.array_equal(t[:, 0], np.arange(len(t))) for t in tables.tables)


def test_pareto_tables_have_the_reference_skew(tmp_path: Path):
    """pareto(a=0.25) puts most extra ids on a few rows; uniform spreads them."""
    rows = 20_000
    pareto = open_index_tables(tmp_path, MultiHotSpec((10,), (rows,), "pareto")).tables[0][:, 1:]
    uniform = open_index_tables(tmp_path, MultiHotSpec((10,), (rows,), "uniform")).tables[0][:, 1:]
    top = lambda a: (
        np.sort(np.bincount(a.ravel(), minlength=rows))[::-1][: rows // 100].sum() / a.size
    )
    assert top(pareto) > 0.5 and top(uniform) < 0.05


def test_expand_is_the_table_row_of_each_id_folded_into_the_rows(tmp_path: Path):
    tables = open_index_tables(tmp_path, MultiHotSpec((3, 1), (10, 5)))
    ids = np.array([0, 9, 3, 13], np.uint32)
    np.testing.assert_array_equal(tables.expand(0, ids), tables.tables[0][[0, 9, 3, 3]])
    np.testing.assert_array_equal(tables.expand(1, ids), [[0], [4], [3], [3]])


@pytest.mark.parametrize("ahead", [0, multihot_kernel.PREFETCH_AHEAD])
@pytest.mark.parametrize("dtype", [np.int64, np.uint16])
def test_compiled_expansion_writes_the_same_ids_as_numpy(tmp_path: Path, ahead: int, dtype):
    # Sizes of one id, of less than a cache line and of several (rows that straddle lines);
    # ids inside the rows, past them and (signed) negative, which both fold as `x % rows`.
    tables = open_index_tables(tmp_path, MultiHotSpec((1, 3, 40), (7, 50, 1000)))
    rng = np.random.default_rng(1)
    ids = rng.integers(0 if dtype == np.uint16 else -3000, 3000, 2000).astype(dtype)
    for t, size in enumerate(tables.spec.sizes):
        out = np.full(len(ids) * size + 1, -1, np.int64)
        multihot_kernel.expand_rows(tables.plain[t], ids, out[:-1], ahead)
        np.testing.assert_array_equal(out[:-1], tables.expand(t, ids, compiled=False).reshape(-1))
        np.testing.assert_array_equal(tables.expand(t, ids), tables.expand(t, ids, compiled=False))
        assert out[-1] == -1  # nothing written past the feature's ids


def test_tables_are_generated_once_and_reused(tmp_path: Path):
    spec = MultiHotSpec((2, 3), (40, 60), "uniform", seed=5)
    drawn: list[int] = []
    first = open_index_tables(tmp_path, spec, on_table=lambda t, n: drawn.append(t))
    assert drawn == [0, 1]
    again = open_index_tables(tmp_path, spec, on_table=lambda t, n: drawn.append(t))
    assert drawn == [0, 1] and all(np.array_equal(a, b) for a, b in zip(first.tables, again.tables))
    other = open_index_tables(tmp_path, MultiHotSpec((2, 3), (40, 60), "uniform", seed=6))
    assert other.directory != first.directory and not np.array_equal(
        other.tables[1], first.tables[1]
    )
    # A table truncated on disk is not trusted: everything is drawn again, to the same values.
    path = first.directory / "table-001.npy"
    path.write_bytes(path.read_bytes()[:-4])
    redrawn = open_index_tables(tmp_path, spec, on_table=lambda t, n: drawn.append(t))
    assert drawn == [0, 1, 0, 1]
    np.testing.assert_array_equal(
        redrawn.tables[1], reference_tables([2, 3], [40, 60], "uniform", seed=5)[1]
    )


def test_a_killed_generation_resumes_at_the_first_unfinished_table(tmp_path: Path, monkeypatch):
    spec = MultiHotSpec((4, 2, 6), (30, 20, 50), "pareto")
    real = table_files.write_table
    calls: list[int] = []

    def dies_on_third(path, rng, rows, size, dist, chunk_ids):
        calls.append(rows)
        if rows == 50:
            raise KeyboardInterrupt  # killed while drawing table 2
        real(path, rng, rows, size, dist, chunk_ids)

    monkeypatch.setattr(table_files, "write_table", dies_on_third)
    with pytest.raises(KeyboardInterrupt):
        open_index_tables(tmp_path, spec, chunk_ids=3)
    assert not (tmp_path / spec.key / multihot.MARKER).exists()
    assert not list((tmp_path / spec.key).glob(".table-*"))  # no temporary left behind
    monkeypatch.setattr(table_files, "write_table", real)
    drawn: list[int] = []
    tables = open_index_tables(tmp_path, spec, chunk_ids=5, on_table=lambda t, n: drawn.append(t))
    assert calls == [30, 20, 50] and drawn == [2]
    for got, want in zip(tables.tables, reference_tables([4, 2, 6], [30, 20, 50], "pareto")):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sizes": (1, 2), "rows": (5,)}, "one value per feature"),
        ({"sizes": (0,), "rows": (5,)}, "multi-hot size 0 of feature 0 must be at least 1"),
        ({"sizes": (2,), "rows": (0,)}, "table rows 0 of feature 0"),
        ({"sizes": (2,), "rows": (2**31,)}, "must lie in [1, 2^31)"),
        ({"sizes": (2,), "rows": (5,), "dist": "zipf"}, "'zipf' must be one of uniform, pareto"),
        ({"sizes": (2,), "rows": (5,), "seed": -1}, "seed -1"),
    ],
)
def test_bad_specs_are_one_clear_error(kwargs: dict, message: str):
    with pytest.raises(ValueError, match=None) as err:
        MultiHotSpec(**kwargs)
    assert message in str(err.value)


def test_spec_from_a_manifest_takes_its_cardinalities(tmp_path: Path):
    manifest = write_tiny_dataset(tmp_path / "d", rows={"train": [10]})
    spec = multihot_spec(manifest, [3, 1, 2, 4], dist="pareto", seed=1)
    assert spec.rows == (50, 300, 7, 1000) and spec.sizes == (3, 1, 2, 4)
    assert multihot_spec(manifest, [3, 1, 2, 4], rows=[5, 6, 7, 8]).rows == (5, 6, 7, 8)
    with pytest.raises(
        ValueError, match=r"3 multi-hot sizes for 4 sparse features \(f0, f1, f2, f3\)"
    ):
        multihot_spec(manifest, [3, 1, 2])
    with pytest.raises(ValueError, match="2 table rows for 4 sparse features"):
        multihot_spec(manifest, [3, 1, 2, 4], rows=[1, 2])
    jagged = write_tiny_dataset(tmp_path / "j", rows={"train": [10]}, multi_hot=("f1",))
    with pytest.raises(ValueError, match="feature f1 is already multi-hot"):
        multihot_spec(jagged, [3, 1, 2, 4])


def test_a_table_too_large_for_int32_ids_is_refused_naming_its_feature(tmp_path: Path):
    """Before: 'table rows 3000000000 of feature 2 must lie in [1, 2^31)', the feature by index."""
    manifest = write_tiny_dataset(tmp_path / "d", rows={"train": [10]})
    manifest.sparse_features[2].cardinality = 3_000_000_000  # a spec's hash_size can be
    said = (
        r"^feature f2: 3,000,000,000 table rows \(its cardinality\), but multi-hot index tables "
        r"hold int32 ids: give it from 1 to 2\^31 - 1 \(`data multihot --rows`, "
        r"data.multihot_rows in training\)$"
    )
    with pytest.raises(ValueError, match=said):
        multihot_spec(manifest, [3, 1, 2, 4])
    with pytest.raises(ValueError, match=r"^feature f3: 2,147,483,648 table rows, but"):
        multihot_spec(manifest, [3, 1, 2, 4], rows=[5, 6, 7, 2**31])


def test_index_tables_are_cached_under_xdg_cache_home_or_home(tmp_path, monkeypatch):
    """Where `shardrec data multihot` and the loader draw the tables once (README)."""
    from shardrec.dataloader.multihot.multihot_tables import default_cache_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "shardrec" / "multihot"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "shardrec" / "multihot"


def test_a_batch_expands_to_the_same_values_and_lengths_with_or_without_the_compiler(
    tmp_path: Path,
):
    """A host without numba gets the batch the compiled path gives: the features' values one after
    another, feature-major, each id's row in turn, and the lengths of every sample."""
    tables = open_index_tables(tmp_path, MultiHotSpec((2, 1, 4), (10, 5, 300)))
    ids = np.array([[0, 9, 12], [1, 4, 2], [299, 7, 300]], np.int64)  # [features, batch]
    plain_values, plain_lengths = tables.expand_batch(ids, compiled=False)
    plain_values = plain_values.copy()  # the pool may hand this memory to the next batch
    values, lengths = tables.expand_batch(ids, compiled=True)
    expected = np.concatenate([tables.expand(f, ids[f], compiled=False).ravel() for f in range(3)])
    np.testing.assert_array_equal(plain_values, expected)
    np.testing.assert_array_equal(values, expected)
    np.testing.assert_array_equal(plain_lengths, [2, 2, 2, 1, 1, 1, 4, 4, 4])
    np.testing.assert_array_equal(lengths, plain_lengths)


def test_a_spec_from_a_manifest_draws_the_references_tables_by_default(tmp_path: Path):
    """Unless told a seed, the tables are the ones the reference draws (numpy seeded with 0)."""
    manifest = write_tiny_dataset(tmp_path / "d", rows={"train": [10]})
    spec = multihot_spec(manifest, [3, 1, 2, 4])
    tables = open_index_tables(tmp_path / "cache", spec)
    for got, want in zip(tables.tables, reference_tables([3, 1, 2, 4], list(spec.rows), "uniform")):
        np.testing.assert_array_equal(got, want)


def test_specs_that_differ_keep_their_own_tables_in_one_cache(tmp_path: Path):
    """Two runs with other table rows share a cache directory without redrawing each other's."""
    small, large = MultiHotSpec((3, 2), (10, 20)), MultiHotSpec((3, 2), (10, 21))
    first = open_index_tables(tmp_path, small).directory
    assert open_index_tables(tmp_path, large).directory != first
    stamps = sorted((p.name, p.stat().st_mtime_ns) for p in first.iterdir())
    again = open_index_tables(tmp_path, small)
    assert again.directory == first
    assert sorted((p.name, p.stat().st_mtime_ns) for p in first.iterdir()) == stamps
