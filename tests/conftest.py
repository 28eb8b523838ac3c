"""Shared fixtures. `tiny_dataset` writes a small dataset in shardrec's format directly,
without the preprocessing pipeline, so loader/planner/trainer tests do not depend on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardrec.dataloader.format.manifest import (
    Manifest,
    SparseFeature,
    SplitInfo,
    smallest_uint,
    write_part,
)


def write_tiny_dataset(
    directory: Path,
    rows: dict[str, list[int]] | None = None,
    num_dense: int = 4,
    cardinalities: tuple[int, ...] = (50, 300, 7, 1000),
    multi_hot: tuple[str, ...] = (),
    seed: int = 0,
) -> Manifest:
    """Write a dataset whose labels depend on the features (so models can learn it).

    Args:
        rows: split name -> rows of each part, e.g. {"train": [500, 300], "val": [200]}.
        multi_hot: names of features (f0, f1, ...) stored as jagged lists of 0-3 ids per row.
    """
    rows = rows or {"train": [600, 400], "val": [256], "test": [256]}
    rng = np.random.default_rng(seed)
    names = [f"f{i}" for i in range(len(cardinalities))]
    weights = [rng.normal(0, 1.5, c) for c in cardinalities]
    splits = {}
    for split, part_rows in rows.items():
        info = SplitInfo()
        for i, n in enumerate(part_rows):
            dense = rng.normal(0, 1, (n, num_dense)).astype(np.float32)
            sparse, offsets, logit = {}, {}, dense[:, 0].astype(np.float64)
            for name, card, w in zip(names, cardinalities, weights):
                dtype = smallest_uint(card - 1)
                if name in multi_hot:
                    lengths = rng.integers(0, 4, n)
                    off = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
                    ids = rng.integers(0, card, int(off[-1])).astype(dtype)
                    sparse[name], offsets[name] = ids, off
                else:
                    ids = rng.integers(0, card, n).astype(dtype)
                    sparse[name] = ids
                    logit += w[ids.astype(np.int64)]
            labels = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.uint8)
            info.parts.append(
                write_part(directory / split / f"part-{i:05d}", labels, dense, sparse, offsets)
            )
            info.rows += n
        splits[split] = info
    manifest = Manifest(
        dense_features=[f"d{i}" for i in range(num_dense)],
        sparse_features=[
            SparseFeature(name, card, str(smallest_uint(card - 1)), multi_hot=name in multi_hot)
            for name, card in zip(names, cardinalities)
        ],
        splits=splits,
        options={"source": "tests/conftest.py"},
    )
    manifest.save(directory)
    return manifest


@pytest.fixture
def tiny_dataset(tmp_path: Path) -> Path:
    write_tiny_dataset(tmp_path / "data")
    return tmp_path / "data"


_SHUFFLE_KEYS = ("seed", "block_rows", "window_blocks", "segment_blocks", "group_segments")
_DELIVERY_KEYS = ("num_workers", "prefetch", "pin_memory", "device", "gather_rows", "compiled")


def loader_kwargs(shuffle: bool = True, **flat) -> dict:
    """build_loader's typed arguments from the flat keywords the loader tests vary."""
    from shardrec.dataloader.loader import Delivery, ShuffleSpec

    mix = {k: flat.pop(k) for k in _SHUFFLE_KEYS if k in flat}
    delivery = {k: flat.pop(k) for k in _DELIVERY_KEYS if k in flat}
    return {
        **flat,
        "shuffle": ShuffleSpec(enabled=shuffle, **mix),
        "delivery": Delivery(**delivery),
    }
