"""Shared fixtures. `tiny_dataset` writes a small dataset in shardrec's format directly,
without the preprocessing pipeline, so loader/planner/trainer tests do not depend on it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

from shardrec.dataloader.format.manifest import (
    PART_SUFFIX,
    Manifest,
    SparseFeature,
    SplitInfo,
    smallest_uint,
)
from shardrec.dataloader.format.part_file import file_layout, write_part
from shardrec.dataloader.format.raw_ids import MISSING_KEY, RAW
from shardrec.trainer.distributed.devices import rank_threads

# Every command keeps SIGINT ignored where it started so (POSIX: a script's `cmd &`, 184da26), and
# a test run started that way (CI in the background, `make test &`) hands SIG_IGN to each worker
# and each command the tests start. The tests that send a Ctrl-C test a command started from a
# terminal, so the run gives its workers (and through them their commands) what a terminal gives;
# the tests of a job started with SIGINT ignored ignore it in their own child.
# git keeps no folder modes: a checkout under umask 002 (many Linux users' default) leaves the
# fixture runs' checkpoint folders group-writable, and every command refuses such a checkpoint
# (trust.check_owner: "writable by other users (mode 775)"), as a real save never leaves one (it
# makes them private whatever the umask). They are made as a save makes them, before any test
# copies them (shutil.copytree keeps modes); before, `make test` of such a checkout failed.
for _path in [_FIXTURES := Path(__file__).parent / "fixtures", *_FIXTURES.rglob("*")]:
    if not _path.is_symlink() and _path.stat().st_mode & 0o022:
        _path.chmod(_path.stat().st_mode & ~0o022)

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# xdist's workers (`make test`: 2) share the machine's cores as a job's ranks do, so each worker,
# and the commands and ranks its tests start, runs torch on its share of them (OMP_NUM_THREADS,
# read as torch loads, here before any test module imports it), as shardrec shares them out among
# ranks (devices.rank_threads). With torch's default of a thread per core in every process, a
# thread done with its part of an op spins, waiting for one that the other worker's processes
# preempted: a 1-rank training of 150 tiny steps took ~40% more CPU. A value the run was started
# with stays; the tests of the default unset it.
_WORKER_THREADS = rank_threads(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
if _WORKER_THREADS is not None and "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(_WORKER_THREADS)


def write_tiny_dataset(
    directory: Path,
    rows: dict[str, list[int]] | None = None,
    num_dense: int = 4,
    cardinalities: tuple[int, ...] = (50, 300, 7, 1000),
    multi_hot: tuple[str, ...] = (),
    seed: int = 0,
    raw: tuple[str, ...] = (),
    day: int = 0,
) -> Manifest:
    """Write a dataset whose labels depend on the features (so models can learn it).

    Args:
        rows: split name -> rows of each part, e.g. {"train": [500, 300], "val": [200]}.
        multi_hot: names of features (f0, f1, ...) stored as jagged lists of 0-3 ids per row.
        raw: names of one-hot features stored as raw 64-bit ids (format.raw_ids): Zipf-drawn items
            whose ranks shift by `day` * cardinality / 4 (new items each day), about 5% missing;
            the item's effect on the label is fixed for its life.
    """
    rows = rows or {"train": [600, 400], "val": [256], "test": [256]}
    rng = np.random.default_rng(seed)
    names = [f"f{i}" for i in range(len(cardinalities))]
    weights = [rng.normal(0, 1.5, c) for c in cardinalities]
    features = [
        SparseFeature(name, card, str(smallest_uint(card - 1)), multi_hot=name in multi_hot)
        if name not in raw
        else SparseFeature(name, 0, "uint64", ids=RAW)
        for name, card in zip(names, cardinalities)
    ]
    dense_names = [f"d{i}" for i in range(num_dense)]
    layout = file_layout(dense_names, "float32", features)
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
                elif name in raw:
                    item = rng.zipf(1.3, n).astype(np.int64) + day * (card // 4)
                    keys = (item.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
                    keys[rng.random(n) < 0.05] = np.uint64(MISSING_KEY)
                    sparse[name] = keys
                    logit += w[item % card]
                else:
                    ids = rng.integers(0, card, n).astype(dtype)
                    sparse[name] = ids
                    logit += w[ids.astype(np.int64)]
            labels = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.uint8)
            path = directory / split / f"part-{i:05d}{PART_SUFFIX}"
            info.parts.append(write_part(path, layout, labels, dense, sparse, offsets))
            info.rows += n
        splits[split] = info
    manifest = Manifest(
        dense_features=dense_names,
        sparse_features=features,
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


@pytest.fixture(scope="session")
def after_training(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A preprocessed dataset (day_0: train, day_1: val + test) and a run that stopped at the
    target (after_training.train_to_target), made once for the after-training tests."""
    from after_training import train_to_target

    return train_to_target(tmp_path_factory.mktemp("after_training"))


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
