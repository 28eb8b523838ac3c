"""The shuffled stream read in spans of whole shuffle windows (window_spans.py): the batches equal
the fixed runs' (`batch(k)`) and numpy's, at any world size, worker count, gather size, tail and
resume point, on parts whose rows are no multiple of the block (every window after the first
short block starts inside a batch)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import write_tiny_dataset
from dataset_writing import resplit

from shardrec.dataloader.digest import batch_digest
from shardrec.dataloader.gather import gather_kernels
from shardrec.dataloader.loader import Delivery, ShuffleSpec, build_loader
from shardrec.dataloader.order import EpochOrder
from shardrec.dataloader.window_spans import window_spans

pytestmark = pytest.mark.skipif(not gather_kernels.AVAILABLE, reason="numba does not import")

SHUFFLE = ShuffleSpec(seed=5, block_rows=16, window_blocks=5, segment_blocks=3, group_segments=4)
"""Windows of 5 blocks (80 rows less the short blocks), groups of 12 blocks."""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("spans")
    write_tiny_dataset(root / "one", rows={"train": [1000]})
    resplit(root / "one", root / "many", 7)  # parts of uneven sizes: short blocks
    return root / "many"


def _loader(directory: Path, rank: int, world: int, batch: int = 48, **kw):
    tail = kw.pop("tail", "drop")
    return build_loader(
        directory,
        "train",
        global_batch_size=batch,
        rank=rank,
        world_size=world,
        shuffle=SHUFFLE,
        tail=tail,
        delivery=Delivery(**kw),
    )


def _digests(batches, names) -> list[str]:
    return [batch_digest([b], names) for b in batches]


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("tail", ["drop", "pad"])
@pytest.mark.parametrize(
    "delivery",
    [
        dict(gather_rows=30),  # spans shorter than a batch: a batch completed over several spans
        dict(gather_rows=200, num_workers=2),
        dict(gather_rows=10_000),  # one span for the epoch
    ],
)
def test_spans_give_the_fixed_runs_batches(dataset, world: int, tail: str, delivery: dict):
    for rank in range(world):
        loader = _loader(dataset, rank, world, tail=tail, **delivery)
        names = loader.feature_names
        streamed = _digests(loader, names)
        assert len(streamed) == len(loader)
        reference = _loader(dataset, rank, world, tail=tail, gather_rows=48 // world)
        assert streamed == _digests((reference.batch(k) for k in range(len(loader))), names)
        numpy = _loader(dataset, rank, world, tail=tail, compiled=False)
        assert streamed == _digests(numpy, names)


def test_a_resume_inside_an_epoch_continues_the_spans_stream(dataset):
    whole = _loader(dataset, 1, 2, gather_rows=100)
    names = whole.feature_names
    expected = _digests(whole, names)
    first = _loader(dataset, 1, 2, gather_rows=100)
    taken = []
    for k, batch in enumerate(first):
        taken.append(batch_digest([batch], names))
        if k == 6:
            break
    resumed = _loader(dataset, 1, 2, gather_rows=100)
    resumed.load_state_dict(first.state_dict())
    assert taken + _digests(resumed, names) == expected


def test_spans_end_where_shuffle_windows_end(dataset):
    loader = _loader(dataset, 0, 1, batch=32, gather_rows=50)
    order = EpochOrder(loader.spec, 0)
    n = loader.spec.num_samples
    spans = list(window_spans(order, 0, 32, 0, len(loader) * 32, 50))
    assert spans[0][0] == 0 and spans[-1][1] == len(loader) * 32
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    window_ends = {order.window_end(p) for p in range(n)}
    assert all(q1 in window_ends for _, q1 in spans[:-1])
    assert all(q1 - q0 >= 25 for q0, q1 in spans[:-1])
    # Short blocks put some window ends inside batches: the case the spans are for.
    assert any(q1 % 32 for _, q1 in spans[:-1])
    assert np.array_equal(
        np.concatenate([order.rows(q0, q1) for q0, q1 in spans]), order.rows(0, len(loader) * 32)
    )
