"""The rows the loader benchmarks read: the same random Criteo-shaped rows (13 dense, 26 sparse with
Kaggle's cardinalities, a label) as a shardrec dataset of any number of parts and in torchrec's
`.npy` layout, and the page cache warmed with them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardrec.dataloader.format import torchrec_npy as npy

KAGGLE_CARDINALITIES = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
    27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
)  # fmt: skip
NUM_DENSE = 13


def write_bench_data(
    directory: Path, rows: int, seed: int = 0, parts: int = 1, name: str = "shardrec"
) -> tuple[Path, Path]:
    """Write the same random Criteo-shaped rows as a shardrec dataset (`parts` parts, in
    directory/name) and in torchrec's layout (one day, in directory/torchrec)."""
    from shardrec.dataloader.format.manifest import (
        PART_SUFFIX,
        Manifest,
        SparseFeature,
        SplitInfo,
        smallest_uint,
    )
    from shardrec.dataloader.format.part_file import file_layout, write_part

    rng = np.random.default_rng(seed)
    labels = (rng.random(rows) < 0.25).astype(np.uint8)
    dense = rng.random((rows, NUM_DENSE), dtype=np.float32)
    ids = np.stack([rng.integers(0, c, rows) for c in KAGGLE_CARDINALITIES], axis=1).astype(
        np.int32
    )
    names = [f"C{i + 1}" for i in range(len(KAGGLE_CARDINALITIES))]
    ours, theirs = directory / name, directory / "torchrec"
    sparse = {
        n: ids[:, i].astype(smallest_uint(c - 1))
        for i, (n, c) in enumerate(zip(names, KAGGLE_CARDINALITIES))
    }
    features = [
        SparseFeature(n, c, str(smallest_uint(c - 1))) for n, c in zip(names, KAGGLE_CARDINALITIES)
    ]
    dense_names = [f"I{i + 1}" for i in range(NUM_DENSE)]
    layout = file_layout(dense_names, "float32", features)
    bounds = [rows * k // parts for k in range(parts + 1)]
    written = [
        write_part(
            ours / "train" / f"part-{k:05d}{PART_SUFFIX}",
            layout,
            labels[a:b],
            dense[a:b],
            {n: v[a:b] for n, v in sparse.items()},
            fsync=False,
        )
        for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))
    ]
    Manifest(dense_names, features, {"train": SplitInfo(rows, written)}).save(ours)
    if npy.day_file(theirs, 0, "labels").is_file():
        return ours, theirs
    theirs.mkdir(parents=True, exist_ok=True)
    np.save(npy.day_file(theirs, 0, "dense"), dense)
    np.save(npy.day_file(theirs, 0, "sparse"), ids)
    np.save(npy.day_file(theirs, 0, "labels"), labels.astype(np.int32).reshape(-1, 1))
    return ours, theirs


def warm_page_cache(directory: Path) -> int:
    """Read every file once so the runs measure page-cache reads; returns bytes read."""
    total = 0
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        with open(path, "rb") as f:
            while block := f.read(1 << 24):
                total += len(block)
    return total
