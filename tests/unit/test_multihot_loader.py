"""Multi-hot on the fly (build_loader(multihot=...)): the same batches as reading the
materialised dataset, at any world size, with either gather path, resumable like every stream."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from conftest import loader_kwargs, write_tiny_dataset
from multihot_reference import reference_multihot, reference_tables

from shardrec.dataloader.digest import stream_digests
from shardrec.dataloader.format.manifest import Manifest
from shardrec.dataloader.format.part_file import open_split
from shardrec.dataloader.format.source import open_source
from shardrec.dataloader.loader import build_loader
from shardrec.dataloader.multihot.multihot_tables import MultiHotOption, multihot_source
from shardrec.embeddings.dims import table_specs
from shardrec.tools.preprocess.derived.multihot_dataset import materialize_multihot
from shardrec.trainer.job.data_options import model_manifest
from shardrec.trainer.job.sections import DataConfig

SIZES = (3, 1, 2, 6)


@pytest.fixture
def datasets(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(one-hot dataset, its materialised multi-hot copy, the table cache)."""
    write_tiny_dataset(tmp_path / "one", rows={"train": [300, 200, 100], "val": [100]})
    materialize_multihot(
        tmp_path / "one",
        tmp_path / "mat",
        list(SIZES),
        dist="pareto",
        seed=3,
        cache_dir=tmp_path / "cache",
    )
    return tmp_path / "one", tmp_path / "mat", tmp_path / "cache"


def _loaders(
    directory: Path,
    world_size: int,
    multihot: MultiHotOption | None = None,
    split: str = "train",
    **kw,
) -> list:
    return [
        build_loader(
            directory,
            split,
            global_batch_size=64,
            rank=r,
            world_size=world_size,
            multihot=multihot,
            **loader_kwargs(seed=5, **kw),
        )
        for r in range(world_size)
    ]


def _option(cache: Path) -> MultiHotOption:
    return MultiHotOption(SIZES, dist="pareto", seed=3, cache_dir=cache)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("world_size", [1, 2])
def test_on_the_fly_batches_equal_the_materialised_dataset(
    datasets, compiled: bool, world_size: int
):
    one, mat, cache = datasets
    want = list(stream_digests(_loaders(mat, 1, compiled=compiled), 0, 9))
    got = list(stream_digests(_loaders(one, world_size, _option(cache), compiled=compiled), 0, 9))
    assert len(got) == 9 and got == want
    plain = list(stream_digests(_loaders(one, 1, compiled=compiled), 0, 9))
    assert plain != want  # the one-hot stream differs: the digests do see the multi-hot ids


def test_on_the_fly_ids_are_the_reference_ids(datasets):
    one, _, cache = datasets
    loader = _loaders(one, 1, _option(cache), shuffle=False)[0]
    batch = next(iter(loader)).sparse_features.to_dict()
    tables = reference_tables(list(SIZES), [50, 300, 7, 1000], "pareto", seed=3)
    first = open_split(one, "train")[0]
    for t, name in enumerate(("f0", "f1", "f2", "f3")):
        want = reference_multihot(first.sparse[name][:64], tables[t])
        np.testing.assert_array_equal(batch[name].values().numpy(), want.reshape(-1))
        assert batch[name].lengths().tolist() == [SIZES[t]] * 64


def test_padded_tail_and_workers_match_too(datasets):
    one, mat, cache = datasets
    want = list(stream_digests(_loaders(mat, 1, split="val", tail="pad"), 0, 2))
    assert (
        list(stream_digests(_loaders(one, 2, _option(cache), split="val", tail="pad"), 0, 2))
        == want
    )
    threaded = _loaders(one, 1, _option(cache), num_workers=2)[0]
    direct = _loaders(mat, 1)[0]
    for a, b in zip(threaded, direct):
        assert (
            a.sparse_features.to_dict()["f3"].values().tolist()
            == b.sparse_features.to_dict()["f3"].values().tolist()
        )


def test_batches_the_consumer_keeps_keep_their_ids_while_later_batches_are_made(datasets):
    one, mat, cache = datasets
    # Two batches a run: later runs are made (and released memory reused) while these are held.
    kept = list(_loaders(one, 1, _option(cache), num_workers=2, gather_rows=128)[0])
    want = [b.sparse_features.values().tolist() for b in _loaders(mat, 1)[0]]
    assert len(kept) == 9 and [b.sparse_features.values().tolist() for b in kept] == want


def test_resume_continues_the_stream_and_refuses_other_tables(datasets):
    one, _, cache = datasets
    loader = _loaders(one, 1, _option(cache))[0]
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    rest = [b.sparse_features.to_dict()["f0"].values().tolist() for b in it]
    resumed = _loaders(one, 1, _option(cache))[0]
    resumed.load_state_dict(state)
    assert [b.sparse_features.to_dict()["f0"].values().tolist() for b in resumed] == rest and len(
        rest
    ) == 6
    for other in (None, MultiHotOption(SIZES, dist="pareto", seed=4, cache_dir=cache)):
        with pytest.raises(ValueError, match="fingerprint"):
            _loaders(one, 1, other)[0].load_state_dict(state)


def test_bad_on_the_fly_options_are_one_clear_error(datasets, tmp_path: Path):
    one, mat, cache = datasets
    with pytest.raises(ValueError, match=r"3 multi-hot sizes for 4 sparse features"):
        _loaders(one, 1, MultiHotOption((3, 1, 2), cache_dir=cache))
    with pytest.raises(ValueError, match="feature f0 is already multi-hot"):
        _loaders(mat, 1, _option(cache))


def test_the_rows_given_for_on_the_fly_tables_are_the_rows_drawn(datasets):
    one, _, cache = datasets
    rows = (7, 5, 3, 11)
    option = MultiHotOption(SIZES, rows=rows, cache_dir=cache)
    _, tables = multihot_source(open_source(one, "train"), option)
    assert tables.spec.rows == rows
    assert [len(t) for t in tables.tables] == list(rows)


def test_a_materialised_copy_keeps_the_tables_features_share_as_on_the_fly_ids_do(tmp_path: Path):
    """A feature spec's `table = "f0"` (f1 reads f0's table): the copy's model shares it too."""
    one = write_tiny_dataset(tmp_path / "one", rows={"train": [64]}, cardinalities=(50, 50, 7, 9))
    shared = [
        dataclasses.replace(f, table="f0") if f.name == "f1" else f for f in one.sparse_features
    ]
    dataclasses.replace(one, sparse_features=shared).save(tmp_path / "one")
    mat = materialize_multihot(tmp_path / "one", tmp_path / "mat", [3, 2, 1, 4], cache_dir=tmp_path)
    on_the_fly = model_manifest(
        Manifest.load(tmp_path / "one"),
        DataConfig(path=str(tmp_path / "one"), multihot_sizes=[3, 2, 1, 4]),
    )
    assert [f.table for f in Manifest.load(tmp_path / "mat").sparse_features] == ["", "f0", "", ""]
    assert table_specs(mat, 8) == table_specs(on_the_fly, 8)
    assert [(t.name, t.shared) for t in table_specs(mat, 8)] == [
        ("t_f0", ("f1",)),
        ("t_f2", ()),
        ("t_f3", ()),
    ]


def test_raw_ids_are_not_folded_into_multi_hot_ids(tmp_path: Path):
    """Given table rows, on-the-fly multi-hot folded f3's 64-bit keys `% rows` and trained on them."""
    write_tiny_dataset(tmp_path / "raw", rows={"train": [64]}, raw=("f3",))
    option = MultiHotOption(SIZES, rows=(50, 300, 7, 1000), cache_dir=tmp_path / "cache")
    with pytest.raises(
        ValueError, match=r"^feature f3 holds raw ids \(preprocessed with --raw-ids"
    ):
        _loaders(tmp_path / "raw", 1, option)
