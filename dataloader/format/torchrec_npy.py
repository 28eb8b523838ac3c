"""torchrec's binary Criteo layout, `day_N_{dense,sparse,labels}.npy`: the one description of it.

That layout (written by torchrec's `BinaryCriteoUtils.tsv_to_npys` and friends) holds, per
day: dense float32 [rows, 13], sparse int32/int64 [rows, 26], labels int32 [rows, 1]. Splits
follow torchrec's convention: with D >= 2 days, "train" is days 0..D-2 and the last day is
halved, its first ceil(rows/2) rows "val" and the rest "test"; a single day is "train" only.
Raw (unhashed) ids are folded into tables with `hashes` (id % hash, per feature).

The loader reads this layout in place (dataloader/format/source.py); `shardrec data import-npy` /
`export-npy` convert it (tools/preprocess/derived/npy_import_export.py). Both name, find and open
the files through this module.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardrec.dataloader.format.manifest import DatasetError

KINDS = ("dense", "sparse", "labels")
WRITE_DTYPES = {
    "dense": np.dtype(np.float32),
    "sparse": np.dtype(np.int64),
    "labels": np.dtype(np.int32),
}
"""What torchrec's scripts write, and so what export writes (int64 ids: `% hashes` keeps ours)."""
_DAY = re.compile(r"^day_(\d+)_dense\.npy$")
EXPORT_MARKER = "export-complete.json"
"""Written last by `shardrec data export-npy`: the day files it made, and its last day's cut."""
_CUT_KEYS = ("name", "val_rows", "test_rows")


def day_file(directory: Path, day: int, kind: str) -> Path:
    """The file of one kind (dense, sparse, labels) of one day."""
    return Path(directory) / f"day_{day}_{kind}.npy"


def write_shapes(rows: int, num_dense: int, num_sparse: int) -> dict[str, tuple[int, int]]:
    """Shape of each of one day's files, as torchrec writes them (labels are a column)."""
    return {"dense": (rows, num_dense), "sparse": (rows, num_sparse), "labels": (rows, 1)}


def feature_names(count: int) -> list[str]:
    """torchrec's names for the categorical columns: cat_0, cat_1, ..."""
    return [f"cat_{i}" for i in range(count)]


def val_rows(last_day_rows: int) -> int:
    """Rows of the last day that are "val" (its first ceil(rows/2)); the rest are "test"."""
    return -(-last_day_rows // 2)


def last_day_val_rows(directory: Path, day: int, rows: int) -> int:
    """Rows of the last day that are "val": as shardrec's export recorded them, else torchrec's
    first ceil(rows/2)."""
    recorded = recorded_val_rows(directory, day, rows)
    return val_rows(rows) if recorded is None else recorded


def recorded_val_rows(directory: Path, day: int, rows: int) -> int | None:
    """Rows of the last day that are "val" as EXPORT_MARKER records them (shardrec's export
    writes its val, then its test, whose sizes need not be ceil/floor of the day's half); None
    without that record. DatasetError if the record no longer describes that day."""
    path = Path(directory) / EXPORT_MARKER
    if not path.is_file():
        return None
    try:
        last = json.loads(path.read_text()).get("last_day")
    except (ValueError, OSError, AttributeError) as e:
        raise DatasetError(f"{path}: unreadable ({e}); remove it or export again") from None
    if last is None:  # an export from before the cut was recorded
        return None
    name, val, test = (last.get(k) if isinstance(last, dict) else None for k in _CUT_KEYS)
    counts = isinstance(val, int) and isinstance(test, int)
    if name != f"day_{day}" or not counts or val < 0 or test < 0 or val + test != rows:
        raise DatasetError(
            f"{path}: records the last day as {name} of {val} val + {test} test rows, but it is "
            f"day_{day} of {rows:,} rows; export again, or remove the file to halve day_{day} as "
            "torchrec does"
        )
    return val


def is_torchrec_npy_dir(directory: Path) -> bool:
    return directory.is_dir() and any(_DAY.match(p.name) for p in directory.iterdir())


def day_numbers(directory: Path) -> list[int]:
    """Numbers of the days that have a dense file, in order."""
    return sorted(int(m.group(1)) for p in Path(directory).iterdir() if (m := _DAY.match(p.name)))


@dataclass
class Day:
    """One day's arrays, memory-mapped; labels are 1-d."""

    dense: np.ndarray
    sparse: np.ndarray
    labels: np.ndarray

    @property
    def rows(self) -> int:
        return int(self.dense.shape[0])


def _load(path: Path) -> np.ndarray:
    if not path.is_file():
        raise DatasetError(
            f"{path}: missing (torchrec layout needs day_N_dense/sparse/labels.npy for every day)"
        )
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        raise DatasetError(f"{path}: unreadable or truncated .npy: {e}") from e


def open_day(directory: Path, day: int) -> Day:
    """Memory-map one day's three files; DatasetError names a missing, unreadable or odd file."""
    dense, sparse, labels = (_load(day_file(directory, day, kind)) for kind in KINDS)
    rows = dense.shape[0]
    if dense.ndim != 2 or sparse.ndim != 2:
        raise DatasetError(
            f"{directory}/day_{day}_*.npy: dense and sparse must be 2-d, got {dense.shape} and {sparse.shape}"
        )
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]
    if labels.ndim != 1:
        raise DatasetError(
            f"{day_file(directory, day, 'labels')}: shape {labels.shape}, expected [rows] or [rows, 1]"
        )
    for kind, arr in (("sparse", sparse), ("labels", labels)):
        if arr.shape[0] != rows:
            raise DatasetError(
                f"{day_file(directory, day, kind)}: {arr.shape[0]} rows, day_{day}_dense.npy has {rows}"
            )
    if not np.issubdtype(sparse.dtype, np.integer):
        raise DatasetError(
            f"{day_file(directory, day, 'sparse')}: dtype {sparse.dtype}, expected integers"
        )
    return Day(dense, sparse, labels)
