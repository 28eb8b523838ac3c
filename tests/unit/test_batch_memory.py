"""Batch memory recycled by the gatherer (gather/batch.py through util/buffer_pool.py): a batch the
consumer still holds is never written over."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from conftest import loader_kwargs, write_tiny_dataset

from shardrec.dataloader.digest import batch_digest
from shardrec.dataloader.loader import build_loader

# Small shuffle levels and gathers: an epoch is many gathers (windows) of several batches each.
SMALL = dict(block_rows=16, window_blocks=8, segment_blocks=4, group_segments=5, gather_rows=96)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("batch_memory") / "data"
    write_tiny_dataset(d, rows={"train": [500, 300, 200], "one": [1000]})
    return d


def _loader(d: Path, split: str, **kw):
    kw = {"global_batch_size": 32, "seed": 3, **SMALL, **kw}
    return build_loader(d, split, rank=0, world_size=1, **loader_kwargs(**kw))


def _digest(batch, names) -> str:
    return batch_digest([batch], names)


@pytest.mark.parametrize("split", ["train", "one"])  # rows of several parts, of one part
@pytest.mark.parametrize("workers", [0, 2])
def test_batches_the_consumer_keeps_are_never_written_over(data: Path, split: str, workers: int):
    loader = _loader(data, split, num_workers=workers)
    names = loader.feature_names
    streamed = [_digest(b, names) for b in loader]  # each batch released before the next
    kept = list(_loader(data, split, num_workers=workers))  # every batch held to the end
    gc.collect()
    for _ in _loader(data, split, num_workers=workers):  # a third epoch beside the kept one
        pass
    assert [_digest(b, names) for b in kept] == streamed
