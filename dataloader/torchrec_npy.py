"""Read torchrec's binary Criteo layout: `day_N_dense.npy`, `day_N_sparse.npy`, `day_N_labels.npy`.

That layout (written by torchrec's `BinaryCriteoUtils.tsv_to_npys` and friends) holds, per
day: dense float32 [rows, 13], sparse int32/int64 [rows, 26], labels int32 [rows, 1]. Splits
follow torchrec's convention: with D >= 2 days, "train" is days 0..D-2 and the last day is
halved, its first ceil(rows/2) rows "val" and the rest "test"; a single day is "train" only.
Raw (unhashed) ids can be folded into tables with `hashes` (id % hash, per feature).

The files are memory-mapped like shardrec's own parts, so the same loader reads them.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np

from shardrec.dataloader.format import DatasetError, Part
from shardrec.dataloader.source import SplitSource

_DAY = re.compile(r"^day_(\d+)_dense\.npy$")
_KINDS = ("dense", "sparse", "labels")


def is_torchrec_npy_dir(directory: Path) -> bool:
    return directory.is_dir() and any(_DAY.match(p.name) for p in directory.iterdir())


def _days(directory: Path) -> list[int]:
    return sorted(int(m.group(1)) for p in directory.iterdir() if (m := _DAY.match(p.name)))


def _load(path: Path) -> np.ndarray:
    if not path.is_file():
        raise DatasetError(f"{path}: missing (torchrec layout needs day_N_dense/sparse/labels.npy for every day)")
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        raise DatasetError(f"{path}: unreadable or truncated .npy: {e}") from e


def _open_day(directory: Path, day: int) -> Part:
    arrays = {kind: _load(directory / f"day_{day}_{kind}.npy") for kind in _KINDS}
    dense, sparse, labels = arrays["dense"], arrays["sparse"], arrays["labels"]
    rows = dense.shape[0]
    if dense.ndim != 2 or sparse.ndim != 2:
        raise DatasetError(f"{directory}/day_{day}_*.npy: dense and sparse must be 2-d, got {dense.shape} and {sparse.shape}")
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    for kind, arr in (("sparse", sparse), ("labels", labels)):
        if arr.shape[0] != rows:
            raise DatasetError(f"{directory / f'day_{day}_{kind}.npy'}: {arr.shape[0]} rows, day_{day}_dense.npy has {rows}")
    if not np.issubdtype(sparse.dtype, np.integer):
        raise DatasetError(f"{directory / f'day_{day}_sparse.npy'}: dtype {sparse.dtype}, expected integers")
    names = feature_names(sparse.shape[1])
    return Part(directory / f"day_{day}", rows, labels, dense, {n: sparse[:, i] for i, n in enumerate(names)}, {})


def feature_names(count: int) -> list[str]:
    """torchrec's names for the categorical columns: cat_0, cat_1, ..."""
    return [f"cat_{i}" for i in range(count)]


def _slice(part: Part, start: int, stop: int) -> Part:
    return Part(
        part.path, stop - start, part.labels[start:stop], part.dense[start:stop], {k: v[start:stop] for k, v in part.sparse.items()}, {}
    )


def open_torchrec_npy(directory: str | Path, split: str, hashes: list[int] | int | None = None) -> SplitSource:
    """Memory-map one split of a torchrec day_N_*.npy directory."""
    directory = Path(directory)
    days = _days(directory)
    if not days:
        raise DatasetError(f"{directory}: no day_N_dense.npy files")
    if split == "train":
        parts = [_open_day(directory, d) for d in (days[:-1] if len(days) > 1 else days)]
    elif split in ("val", "test"):
        if len(days) < 2:
            raise DatasetError(f"{directory}: split {split!r} needs at least 2 days (the last day is halved into val/test)")
        last = _open_day(directory, days[-1])
        half = -(-last.rows // 2)
        parts = [_slice(last, 0, half) if split == "val" else _slice(last, half, last.rows)]
    else:
        raise DatasetError(f"{directory}: no split {split!r} (torchrec layout has train, val, test)")
    names = list(parts[0].sparse)
    if any(list(p.sparse) != names or p.dense.shape[1] != parts[0].dense.shape[1] for p in parts):
        raise DatasetError(f"{directory}: days disagree on the number of dense or sparse columns")
    modulo: dict[str, int] = {}
    if hashes is not None:
        sizes = [hashes] * len(names) if isinstance(hashes, int) else list(hashes)
        if len(sizes) != len(names) or any(h <= 0 for h in sizes):
            raise ValueError(f"hashes must be one positive size or {len(names)} of them, got {hashes}")
        modulo = dict(zip(names, sizes))
    h = hashlib.sha256(f"torchrec-npy:{split}:{hashes}".encode())
    for d in days:
        for kind in _KINDS:
            path = directory / f"day_{d}_{kind}.npy"
            h.update(f"{path.name}:{path.stat().st_size};".encode())
    return SplitSource(directory, split, parts, names, set(), modulo, h.hexdigest())
