"""Interop with torchrec's preprocessed Criteo layout: `day_N_{dense,sparse,labels}.npy`.

The layout (names, dtypes, shapes, torchrec's splits) is described once, in
dataloader/format/torchrec_npy.py; torchrec's dense values are already log-transformed and its
sparse values raw (missing parsed as 0), taken as `value % hashes[feature]`.

Import reproduces exactly that: the same splits and ids, dense values copied as they are, so
data preprocessed with torchrec's scripts trains here without being redone. Export writes our
splits in that layout: one day file per training part, and a last day of val then test (as
torchrec reads it, whichever half of its input file the dataset's val was), with ids as int64 so
that torchrec's `% hashes` with hashes = our cardinalities leaves them unchanged. The marker export
writes last records where val ends, which need not be torchrec's ceil(rows/2); import and the
loader cut there (torchrec_npy.last_day_val_rows), so a round trip gives back every split's rows.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardrec.dataloader.format import torchrec_npy as npy
from shardrec.dataloader.format.manifest import (
    PART_SUFFIX,
    SPLITS,
    Manifest,
    SparseFeature,
    SplitInfo,
    smallest_uint,
)
from shardrec.dataloader.format.part_file import file_layout, open_split, write_part
from shardrec.dataloader.util.files import atomic_path, atomic_write_bytes
from shardrec.tools.preprocess.parts.feature_stats import compute_feature_stats

logger = logging.getLogger(__name__)
ROWS_PER_PART = 1 << 20
EXPORT_MARKER = npy.EXPORT_MARKER  # written last by export_npy


def find_days(src: Path) -> list[int]:
    """Day numbers that have all three files, in order; ValueError names what is missing."""
    if not src.is_dir():
        raise ValueError(f"{src}: not a directory")
    days = npy.day_numbers(src)
    if len(days) < 2:
        raise ValueError(
            f"{src}: needs at least two day_N_dense.npy days (the last is halved into val/test), found {len(days)}"
        )
    for d in days:
        for kind in ("sparse", "labels"):
            if not npy.day_file(src, d, kind).is_file():
                raise ValueError(
                    f"{npy.day_file(src, d, kind)}: missing (day_{d}_dense.npy exists)"
                )
    return days


def _check_finite(path: Path, start: int, values: np.ndarray) -> None:
    """A dense value that is NaN or infinite (the arrays of torchrec's old log(x + 3) of a -3)
    would train the model on it: refused, naming the file, row and column."""
    bad = np.argwhere(~np.isfinite(values))
    if len(bad):
        row, col = (int(v) for v in bad[0])
        count = int((~np.isfinite(values)).sum())
        raise ValueError(
            f"{path}: row {start + row:,}, column {col} (I{col + 1}): {values[row, col]} is not a "
            f"number a model can train on ({count:,} such value{'s' * (count != 1)} in rows {start:,}-"
            f"{start + len(values) - 1:,}); remake the arrays with finite values (`shardrec data "
            "reference-npy DAYS --out DIR --dense log-min2` writes log(x - day minimum + 2))"
        )


class MaxIdsError(ValueError):
    """Table rows (`--max-ids`) that cannot be the tables': the CLI names the flag as typed."""


def _table_rows(src: Path, days: list[int], hashes: list[int] | None, num_sparse: int) -> list[int]:
    """Rows of each feature's table: `hashes` (one for all, or one per feature), or max id + 1."""
    if hashes is None:
        return [
            1 + int(max(np.asarray(npy.open_day(src, d).sparse[:, f]).max(initial=0) for d in days))
            for f in range(num_sparse)
        ]
    bad = [h for h in hashes if h <= 0]
    if bad:
        raise MaxIdsError(f"table rows must be positive, got {bad[0]}")
    if len(hashes) == 1:
        return hashes * num_sparse
    if len(hashes) != num_sparse:
        raise MaxIdsError(
            f"{len(hashes)} values for {num_sparse} sparse features; give one for all or one per "
            "feature"
        )
    return hashes


def _check_columns(src: Path, days: list[int]) -> npy.Day:
    """Every day's dense and sparse columns as the first day's (before anything is written);
    returns the first day."""
    first = npy.open_day(src, days[0])
    for d in days[1:]:
        day = npy.open_day(src, d)
        for kind in ("dense", "sparse"):
            got, want = getattr(day, kind).shape, getattr(first, kind).shape
            if got[1] != want[1]:
                raise ValueError(
                    f"{npy.day_file(src, d, kind)}: shape {got}, expected {(got[0], want[1])} "
                    f"({npy.day_file(src, days[0], kind).name} has {want[1]} columns; every day "
                    "needs the same columns)"
                )
    return first


def _check_ids(path: Path, start: int, block: np.ndarray) -> None:
    """A negative id has no row in torchrec's `value % hashes` tables: refused, naming the file,
    row, column and value."""
    bad = np.argwhere(block < 0)
    if len(bad):
        row, col = (int(v) for v in bad[0])
        raise ValueError(
            f"{path}: row {start + row}, column {col} (C{col + 1}): id {block[row, col]} is "
            "negative; torchrec's ids are raw values >= 0 (taken % --max-ids): remake the arrays "
            "without negative ids"
        )


def _check_labels(path: Path, start: int, labels: np.ndarray) -> None:
    """A label other than 0 or 1 would be stored as a byte (256 as 0) and trained on as a click:
    refused, naming the file, row and value."""
    bad = np.flatnonzero((labels != 0) & (labels != 1))
    if len(bad):
        row = int(bad[0])
        raise ValueError(f"{path}: row {start + row}: label {labels[row]}; labels must be 0 or 1")


def check_out(out: Path) -> None:
    """Refuse an output that is not new (or an empty directory): an import never replaces a
    dataset (or anything else) already there."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: exists and is not an empty directory; choose a new --out")


def import_npy(
    src: Path, out: Path, hashes: list[int] | None, val_half: str | None = None
) -> Manifest:
    """torchrec day files -> a shardrec dataset. hashes: per-feature table rows (None: max id +
    1). val_half: which half of the last day is val (None: the first, or as export recorded).

    The dataset is written into a temporary folder beside `out` and renamed to `out` only when
    whole: a refused or interrupted import leaves `out` as it was (new or empty)."""
    days = find_days(src)
    cut = _last_day_cut(src, days[-1], val_half)
    check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.import-npy-{os.getpid()}.tmp"
    try:
        manifest = _write_dataset(src, tmp, days, hashes, cut)
        # rename(2) replaces an empty directory; one that filled up meanwhile is refused.
        try:
            os.replace(tmp, out)
        except OSError as e:
            raise ValueError(
                f"{out}: cannot put the imported dataset there ({e.strerror or e}); "
                "choose a new --out"
            ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return manifest


def _last_day_cut(src: Path, day: int, val_half: str | None) -> tuple[str, int]:
    """Which half of the last day is val, and the rows of the first half: torchrec's ceil(rows/2)
    cut, or the val-first cut shardrec's export recorded (which --val-half second contradicts)."""
    rows = npy.open_day(src, day).rows
    recorded = npy.recorded_val_rows(src, day, rows)
    if recorded is None:
        return val_half or "first", npy.val_rows(rows)
    if val_half == "second":
        raise ValueError(
            f"{src / EXPORT_MARKER}: day_{day} holds val ({recorded:,} rows) then test, as "
            "shardrec's export-npy writes it; --val-half second would swap them: leave it out"
        )
    return "first", recorded


def _write_dataset(
    src: Path, out: Path, days: list[int], hashes: list[int] | None, cut: tuple[str, int]
) -> Manifest:
    """The dataset's parts and manifest; cut: which half of the last day is val, and the rows of
    the first half."""
    val_half, mid = cut
    first = _check_columns(src, days)
    num_sparse, num_dense = first.sparse.shape[1], first.dense.shape[1]
    hashes = _table_rows(src, days, hashes, num_sparse)
    names = [f"C{i}" for i in range(1, num_sparse + 1)]
    dtypes = [smallest_uint(h - 1) for h in hashes]
    features = [SparseFeature(n, h, str(dt)) for n, h, dt in zip(names, hashes, dtypes)]
    dense_names = [f"I{i}" for i in range(1, num_dense + 1)]
    layout = file_layout(dense_names, "float32", features)
    splits = {s: SplitInfo() for s in SPLITS}
    for d in days:
        day = npy.open_day(src, d)
        dense, sparse, labels = day.dense, day.sparse, day.labels
        ranges = [("train", 0, len(labels))]
        if d == days[-1]:
            first, second = ("val", "test") if val_half == "first" else ("test", "val")
            ranges = [(first, 0, mid), (second, mid, len(labels))]
        for split, lo, hi in ranges:
            for start in range(lo, hi, ROWS_PER_PART):
                stop = min(hi, start + ROWS_PER_PART)
                block = np.asarray(sparse[start:stop])
                _check_ids(npy.day_file(src, d, "sparse"), start, block)
                ids = {
                    n: (block[:, f].astype(np.uint64) % np.uint64(hashes[f])).astype(dtypes[f])
                    for f, n in enumerate(names)
                }
                values = np.asarray(dense[start:stop], dtype=np.float32)
                _check_finite(npy.day_file(src, d, "dense"), start, values)
                name = f"part-{d:05d}-{start // ROWS_PER_PART:04d}{PART_SUFFIX}"
                clicks = np.asarray(labels[start:stop])
                _check_labels(npy.day_file(src, d, "labels"), start, clicks)
                info = write_part(out / split / name, layout, clicks.astype(np.uint8), values, ids)
                splits[split].parts.append(info)
                splits[split].rows += info.rows
    manifest = Manifest(
        dense_names,
        features,
        splits,
        "float32",
        {
            "source": "torchrec-npy",
            "days": days,
            "hashes": hashes,
            "ids": "value % hashes[feature], as torchrec",
            "splits": {
                "train_days": "all days but the last",
                "halved_day": days[-1],
                "val_half": val_half,
            },
        },  # fmt: skip
    )
    for name, stats in compute_feature_stats(out, manifest).items():
        manifest.feature(name).stats = stats
    manifest.save(out)
    return manifest


def _export_day(parts, out: Path, day: int, names: list[str]) -> int:
    """Stream parts into one day's three .npy files (memory-mapped, written atomically)."""
    rows = sum(p.rows for p in parts)
    shapes = npy.write_shapes(rows, parts[0].dense.shape[1], len(names))
    with ExitStack() as stack:
        tmp = {k: stack.enter_context(atomic_path(npy.day_file(out, day, k))) for k in npy.KINDS}
        arrays = {
            k: np.lib.format.open_memmap(
                tmp[k], mode="w+", dtype=npy.WRITE_DTYPES[k], shape=shapes[k]
            )
            for k in npy.KINDS
        }
        at = 0
        for p in parts:
            arrays["dense"][at : at + p.rows] = p.dense
            for f, n in enumerate(names):
                arrays["sparse"][at : at + p.rows, f] = p.sparse[n]
            arrays["labels"][at : at + p.rows, 0] = p.labels
            at += p.rows
        for arr in arrays.values():
            arr.flush()
    return rows


@dataclass(frozen=True)
class Exported:
    """What export_npy wrote: rows per day file; the last day's val rows, then its test rows."""

    rows: dict[str, int]
    val_rows: int
    test_rows: int


def export_npy(directory: Path, out: Path) -> Exported:
    """A shardrec dataset -> torchrec day files. The last day holds val then test (torchrec's
    order), and the marker records where val ends."""
    manifest = Manifest.load(directory)
    if any(f.multi_hot for f in manifest.sparse_features):
        raise ValueError(f"{directory}: multi-hot features have no torchrec day-file layout")
    names = manifest.feature_names
    out.mkdir(parents=True, exist_ok=True)
    # A marker from an earlier export must not vouch for day files this one may leave half done.
    (out / EXPORT_MARKER).unlink(missing_ok=True)
    written = {}
    train = open_split(directory, "train", manifest) if "train" in manifest.splits else []
    for day, part in enumerate(train):
        written[f"day_{day}"] = _export_day([part], out, day, names)
    halves = {s: manifest.splits[s].rows if s in manifest.splits else 0 for s in ("val", "test")}
    last = [p for s in halves if s in manifest.splits for p in open_split(directory, s, manifest)]
    if not last:
        raise ValueError(f"{directory}: no val/test rows to write as the last day")
    total = sum(p.rows for p in last)
    if halves["val"] != npy.val_rows(total):
        # torchrec cuts the last day at ceil(rows/2); our halves can differ (--val-half second,
        # skipped rows). shardrec's import and loader cut where the marker says.
        logger.warning(
            "val has %d of %d last-day rows; torchrec's own loader will cut day_%d at %d",
            halves["val"],
            total,
            len(train),
            npy.val_rows(total),
        )
    written[f"day_{len(train)}"] = _export_day(last, out, len(train), names)
    _mark_export_complete(directory, out, written, halves)
    return Exported(written, halves["val"], halves["test"])


def _mark_export_complete(
    directory: Path, out: Path, written: dict[str, int], halves: dict[str, int]
) -> None:
    """Write EXPORT_MARKER last: its presence says every day file it lists is whole (a killed
    export leaves complete-looking day files, but no marker); it records the last day's cut."""
    files = {p.name: p.stat().st_size for day in written for p in sorted(out.glob(f"{day}_*.npy"))}
    last_day = {"name": list(written)[-1], "val_rows": halves["val"], "test_rows": halves["test"]}
    record = {"source": str(directory), "rows": written, "bytes": files, "last_day": last_day}
    atomic_write_bytes(out / EXPORT_MARKER, json.dumps(record, indent=1).encode())
