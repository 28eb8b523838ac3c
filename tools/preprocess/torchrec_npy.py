"""Interop with torchrec's preprocessed Criteo layout: `day_N_{dense,sparse,labels}.npy`.

torchrec's scripts (`BinaryCriteoUtils.tsv_to_npys`) write per day:
- day_N_dense.npy   float32 [rows, 13], already log-transformed;
- day_N_sparse.npy  int64 [rows, 26], raw categorical values (missing was parsed as 0);
- day_N_labels.npy  int32 [rows, 1].
Its InMemoryBinaryCriteoIterDataPipe trains on days 0..N-2, halves the last day into val
(first ceil(rows/2)) and test, and takes ids as `value % hashes[feature]`.

Import reproduces exactly that: the same splits and ids, dense values copied as they are, so
data preprocessed with torchrec's scripts trains here without being redone. Export writes our
splits in that layout: one day file per training part, and a last day of val then test (or
test then val when the dataset's val_half is 'second'), with ids as int64 so that torchrec's
`% hashes` with hashes = our cardinalities leaves them unchanged.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np

from shardrec.dataloader.format import SPLITS, Manifest, SparseFeature, SplitInfo, open_split, smallest_uint, write_part
from shardrec.tools.preprocess.stats import compute_feature_stats

logger = logging.getLogger(__name__)
ROWS_PER_PART = 1 << 20
_DAY = re.compile(r"^day_(\d+)_dense\.npy$")


def find_days(src: Path) -> list[int]:
    """Day numbers that have all three files, in order; ValueError names what is missing."""
    if not src.is_dir():
        raise ValueError(f"{src}: not a directory")
    days = sorted(int(m.group(1)) for p in src.iterdir() if (m := _DAY.match(p.name)))
    if len(days) < 2:
        raise ValueError(f"{src}: needs at least two day_N_dense.npy days (the last is halved into val/test), found {len(days)}")
    for d in days:
        for kind in ("sparse", "labels"):
            if not (src / f"day_{d}_{kind}.npy").is_file():
                raise ValueError(f"{src / f'day_{d}_{kind}.npy'}: missing (day_{d}_dense.npy exists)")
    return days


def _load_day(src: Path, day: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    dense = np.load(src / f"day_{day}_dense.npy", mmap_mode="r")
    sparse = np.load(src / f"day_{day}_sparse.npy", mmap_mode="r")
    labels = np.load(src / f"day_{day}_labels.npy", mmap_mode="r").reshape(-1)
    if not (len(dense) == len(sparse) == len(labels)) or sparse.ndim != 2:
        raise ValueError(f"{src}/day_{day}_*.npy: row counts differ (dense {len(dense)}, sparse {len(sparse)}, labels {len(labels)})")
    return dense, sparse, labels


def import_npy(src: Path, out: Path, hashes: list[int] | None, val_half: str = "first") -> Manifest:
    """torchrec day files -> a shardrec dataset. hashes: per-feature table rows (None: max id + 1)."""
    days = find_days(src)
    num_sparse = np.load(src / f"day_{days[0]}_sparse.npy", mmap_mode="r").shape[1]
    num_dense = np.load(src / f"day_{days[0]}_dense.npy", mmap_mode="r").shape[1]
    if hashes is None:
        hashes = [1 + int(max(np.asarray(_load_day(src, d)[1][:, f]).max(initial=0) for d in days)) for f in range(num_sparse)]
    elif len(hashes) == 1:
        hashes = hashes * num_sparse
    if len(hashes) != num_sparse:
        raise ValueError(f"{len(hashes)} hashes for {num_sparse} sparse features")
    names = [f"C{i}" for i in range(1, num_sparse + 1)]
    dtypes = [smallest_uint(h - 1) for h in hashes]
    splits = {s: SplitInfo() for s in SPLITS}
    for d in days:
        dense, sparse, labels = _load_day(src, d)
        ranges = [("train", 0, len(labels))]
        if d == days[-1]:
            mid = (len(labels) + 1) // 2
            first, second = ("val", "test") if val_half == "first" else ("test", "val")
            ranges = [(first, 0, mid), (second, mid, len(labels))]
        for split, lo, hi in ranges:
            for start in range(lo, hi, ROWS_PER_PART):
                stop = min(hi, start + ROWS_PER_PART)
                block = np.asarray(sparse[start:stop])
                if (block < 0).any():
                    raise ValueError(f"{src}/day_{d}_sparse.npy: negative values (rows {start}-{stop})")
                ids = {n: (block[:, f].astype(np.uint64) % np.uint64(hashes[f])).astype(dtypes[f]) for f, n in enumerate(names)}
                info = write_part(out / split / f"part-{d:05d}-{start // ROWS_PER_PART:04d}", np.asarray(labels[start:stop]).astype(np.uint8),
                                  np.asarray(dense[start:stop], dtype=np.float32), ids)  # fmt: skip
                splits[split].parts.append(info)
                splits[split].rows += info.rows
    manifest = Manifest(
        [f"I{i}" for i in range(1, num_dense + 1)],
        [SparseFeature(n, h, str(dt)) for n, h, dt in zip(names, hashes, dtypes)],
        splits,
        "float32",
        {"source": "torchrec-npy", "days": days, "hashes": hashes, "ids": "value % hashes[feature], as torchrec",
         "splits": {"train_days": "all days but the last", "halved_day": days[-1], "val_half": val_half}},  # fmt: skip
    )
    for name, stats in compute_feature_stats(out, manifest).items():
        manifest.feature(name).stats = stats
    manifest.save(out)
    return manifest


def _export_day(parts, out: Path, day: int, names: list[str]) -> int:
    """Stream parts into one day's three .npy files (memory-mapped, written to temporary names)."""
    rows = sum(p.rows for p in parts)
    num_dense = parts[0].dense.shape[1]
    specs = {"dense": (np.float32, (rows, num_dense)), "sparse": (np.int64, (rows, len(names))), "labels": (np.int32, (rows, 1))}
    tmp = {k: out / f".day_{day}_{k}.npy.tmp" for k in specs}
    arrays = {k: np.lib.format.open_memmap(tmp[k], mode="w+", dtype=dt, shape=shape) for k, (dt, shape) in specs.items()}
    at = 0
    for p in parts:
        arrays["dense"][at : at + p.rows] = p.dense
        for f, n in enumerate(names):
            arrays["sparse"][at : at + p.rows, f] = p.sparse[n]
        arrays["labels"][at : at + p.rows, 0] = p.labels
        at += p.rows
    for k, arr in arrays.items():
        arr.flush()
        tmp[k].replace(out / f"day_{day}_{k}.npy")
    return rows


def export_npy(directory: Path, out: Path) -> dict[str, int]:
    """A shardrec dataset -> torchrec day files; returns rows per written day file."""
    manifest = Manifest.load(directory)
    if any(f.multi_hot for f in manifest.sparse_features):
        raise ValueError(f"{directory}: multi-hot features have no torchrec day-file layout")
    names = manifest.feature_names
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    train = open_split(directory, "train", manifest) if "train" in manifest.splits else []
    for day, part in enumerate(train):
        written[f"day_{day}"] = _export_day([part], out, day, names)
    val_half = manifest.options.get("splits", {}).get("val_half", "first")
    halves = ["val", "test"] if val_half == "first" else ["test", "val"]
    last = [p for s in halves if s in manifest.splits for p in open_split(directory, s, manifest)]
    if not last:
        raise ValueError(f"{directory}: no val/test rows to write as the last day")
    first_rows = manifest.splits[halves[0]].rows if halves[0] in manifest.splits else 0
    total = sum(p.rows for p in last)
    if first_rows != (total + 1) // 2:
        # torchrec cuts the last day at ceil(rows/2); skipped rows can make our halves differ.
        logger.warning("%s has %d of %d last-day rows; torchrec will cut at %d", halves[0], first_rows, total, (total + 1) // 2)
    written[f"day_{len(train)}"] = _export_day(last, out, len(train), names)
    return written
