"""The on-disk dataset format shared by `shardrec preprocess` and the loader.

A dataset is a directory::

    DIR/manifest.json
    DIR/<split>/part-00000/label.npy        uint8  [rows]
    DIR/<split>/part-00000/dense.npy        float32 or float16 [rows, num_dense]
    DIR/<split>/part-00000/<feature>.npy    smallest unsigned int that holds the ids [rows]
    DIR/<split>/part-00000/<feature>.offsets.npy   int64 [rows + 1], multi-hot features only

Every column is a plain `.npy` file, so it is memory-mappable with `np.load(mmap_mode="r")`
and readable by any numpy user. A one-hot feature holds one id per row; a multi-hot
(jagged) feature holds its ids back to back with row offsets beside them. Files are written
to a temporary name and renamed (dataloader/util/files.py), and the manifest records the size and SHA-256 of each.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import hashlib
import io
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.dataloader.format.mapping import limit_message, map_npy
from shardrec.dataloader.util import locks
from shardrec.dataloader.util.files import atomic_open, atomic_write_bytes

FORMAT_NAME = "shardrec-dataset"
SCHEMA_VERSION = 1
LISTS_SCHEMA_VERSION = 2
"""Datasets with list features (a feature spec's `role = "list"`): their features may pool by mean,
which a reader of version 1 would train as sum, so such a reader refuses them instead."""
READ_VERSIONS = (SCHEMA_VERSION, LISTS_SCHEMA_VERSION)
MANIFEST = "manifest.json"
SPLITS = ("train", "val", "test")


def _why_no_manifest(directory: Path) -> str:
    """Why DIR has no manifest: preprocessing is writing it, stopped before its end, or never ran
    there."""
    if not (directory / locks.WORK_DIR).is_dir():
        return f"{directory}: not a shardrec dataset (no {MANIFEST}); create one with `shardrec preprocess`"
    writer = locks.dataset_writer(directory)
    if writer is not None:
        return (
            f"{directory}: being written by {locks.describe_writer(writer)} (no {MANIFEST} yet); "
            "wait for it to finish"
        )
    return (
        f"{directory}: preprocessing did not finish (no {MANIFEST}; {locks.WORK_DIR}/ holds its finished "
        "tasks); rerun the same `shardrec preprocess` command to complete it"
    )


class DatasetError(ValueError):
    """A dataset directory that is missing, malformed or disagrees with its manifest."""


def smallest_uint(max_value: int) -> np.dtype:
    """Smallest unsigned integer dtype that holds every value in [0, max_value]."""
    for dtype in (np.uint8, np.uint16, np.uint32, np.uint64):
        if max_value <= np.iinfo(dtype).max:
            return np.dtype(dtype)
    raise ValueError(f"id {max_value} does not fit in 64 bits")


@dataclass
class FileInfo:
    bytes: int
    sha256: str


@dataclass
class PartInfo:
    name: str
    rows: int
    files: dict[str, FileInfo]


@dataclass
class SplitInfo:
    rows: int = 0
    parts: list[PartInfo] = field(default_factory=list)


@dataclass
class SparseFeature:
    name: str
    cardinality: int
    """Number of embedding rows this feature needs (ids lie in [0, cardinality))."""
    dtype: str
    multi_hot: bool = False
    stats: dict[str, float] = field(default_factory=dict)
    """Planner statistics: mean/p95 ids per sample, distinct ids, top-1%/10% lookup share."""
    pooling: str = "sum"
    """How the feature's table pools a row's ids: sum, or mean (a spec's list column). The manifest
    writes it only when it is not sum, so datasets without lists keep version 1's bytes."""

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.pooling == "sum":
            del out["pooling"]
        return out


@dataclass
class Manifest:
    dense_features: list[str]
    sparse_features: list[SparseFeature]
    splits: dict[str, SplitInfo]
    dense_dtype: str = "float32"
    options: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    """Rows dropped while preprocessing, by reason."""
    schema_version: int = SCHEMA_VERSION
    format: str = FORMAT_NAME

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.sparse_features]

    def feature(self, name: str) -> SparseFeature:
        for f in self.sparse_features:
            if f.name == name:
                return f
        raise KeyError(name)

    def to_json(self) -> str:
        out = dataclasses.asdict(self)
        out["sparse_features"] = [f.to_dict() for f in self.sparse_features]
        return json.dumps(out, indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Manifest:
        """Build from parsed JSON; KeyError or TypeError (naming the entry) if it is malformed."""
        _expect_dict(raw.get("splits"), "splits")
        for name, s in raw["splits"].items():
            _expect_dict(s, f"splits.{name}")
            if not isinstance(s.get("parts"), list):
                raise TypeError(
                    f"splits.{name}.parts is {s.get('parts')!r}, expected a list of parts"
                )
            for i, p in enumerate(s["parts"]):
                _expect_dict(p, f"splits.{name}.parts[{i}]")
                _expect_dict(p.get("files"), f"splits.{name}.parts[{i}].files")
        splits = {
            name: SplitInfo(
                rows=s["rows"],
                parts=[
                    PartInfo(
                        p["name"], p["rows"], {k: FileInfo(**v) for k, v in p["files"].items()}
                    )
                    for p in s["parts"]
                ],
            )
            for name, s in raw["splits"].items()
        }
        features = [SparseFeature(**f) for f in raw["sparse_features"]]
        for i, f in enumerate(features):
            if f.pooling not in ("sum", "mean"):
                raise TypeError(
                    f"sparse_features[{i}].pooling is {f.pooling!r}, expected sum or mean"
                )
        rest = {k: v for k, v in raw.items() if k not in ("splits", "sparse_features")}
        return cls(sparse_features=features, splits=splits, **rest)

    @classmethod
    def load(cls, directory: str | Path) -> Manifest:
        """Read DIR/manifest.json; DatasetError names the path if it is not a shardrec dataset."""
        path = Path(directory) / MANIFEST
        if not Path(directory).exists():
            raise DatasetError(f"{directory}: does not exist")
        if not Path(directory).is_dir():
            raise DatasetError(f"{directory}: not a directory")
        if not path.is_file():
            raise DatasetError(_why_no_manifest(Path(directory)))
        try:
            with _no_cyclic_gc():
                raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise DatasetError(f"{path}: unreadable manifest: {e}") from e
        if raw.get("format") != FORMAT_NAME:
            raise DatasetError(f"{path}: format is {raw.get('format')!r}, expected {FORMAT_NAME!r}")
        if raw.get("schema_version") not in READ_VERSIONS or isinstance(
            raw.get("schema_version"), bool
        ):
            raise DatasetError(
                f"{path}: schema_version {raw.get('schema_version')} is not supported "
                f"(this shardrec reads {' and '.join(map(str, READ_VERSIONS))})"
            )
        try:
            with _no_cyclic_gc():
                manifest = cls.from_dict(raw)
        except (KeyError, TypeError, AttributeError) as e:
            raise DatasetError(f"{path}: malformed manifest: {e}") from e
        _check_names(path, manifest)
        return manifest

    def save(self, directory: str | Path) -> None:
        atomic_write_bytes(Path(directory) / MANIFEST, self.to_json().encode())


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while a manifest's objects are made: a 10,000-part
    manifest is ~600 K dicts and dataclasses, none of them garbage, and the collections their
    allocations set off took ~half of Manifest.load (3.5-4.5 s -> 2.0 s, loaded)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _is_plain_name(name: Any) -> bool:
    """A single path component: not empty, not `.`/`..`, no separator or NUL."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and not any(c in name for c in "/\\\0")
    )


def shown(value: Any, width: int = 80) -> str:
    """repr(value) for an error line, cut to `width` characters with its full length said."""
    text = repr(value)
    return text if len(text) <= width else f"{text[:width]}... ({len(text)} characters)"


def _check_names(path: Path, manifest: Manifest) -> None:
    """Every split, part and file name the manifest gives is a plain name, so that the paths built
    from them stay inside the dataset directory (`../`, absolute paths; symlinks are checked as
    each file is opened, `inside_dataset`)."""
    checked: set[str] = set()
    for split, info in manifest.splits.items():
        if not _is_plain_name(split):
            raise DatasetError(
                f"{path}: split name {shown(split)} is not a plain name inside the dataset directory"
            )
        for part in info.parts:
            if not _is_plain_name(part.name):
                raise DatasetError(
                    f"{path}: part {shown(part.name)} of split {split!r} is not a plain name "
                    "inside the dataset directory"
                )
            # Parts list the same ~28 file names: each distinct name is checked once.
            for fname in part.files:
                if fname in checked:
                    continue
                if not _is_plain_name(fname):
                    raise DatasetError(
                        f"{path}: part {split}/{part.name} lists file {shown(fname)}, not a plain name inside the part"
                    )
                checked.add(fname)


@functools.lru_cache(maxsize=64)
def _resolved(directory: Path) -> Path:
    # Resolved once per dataset directory, not for each of a part's ~28 files (part opens are
    # on the loader's path whenever a part is mapped again after eviction).
    return directory.resolve()


def inside_dataset(directory: Path, path: Path) -> None:
    """Refuse a path that a symlink takes out of the dataset directory (a shared dataset directory
    must not make the loader read, or `data verify` hash, files elsewhere)."""
    root = _resolved(directory.absolute())  # keyed absolute: a later chdir cannot mislead it
    if not path.resolve().is_relative_to(root):
        raise DatasetError(
            f"{path}: leads out of the dataset directory {root} (a symlink to {path.resolve()}); "
            f"named by {directory / MANIFEST}"
        )


def _expect_dict(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise TypeError(f"{where} is {value!r:.80}, expected an object")


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _npy_header(array: np.ndarray) -> bytes | None:
    """The exact header np.save writes for `array`, or None where only numpy's writer knows it."""
    if array.dtype.hasobject or array.dtype.names is not None or not array.flags.c_contiguous:
        return None
    head = io.BytesIO()
    try:  # what np.lib.format.write_array picks first; it moves to 2.0 only past 64 KiB of header
        np.lib.format.write_array_header_1_0(head, np.lib.format.header_data_from_array_1_0(array))
    except ValueError:
        return None
    return head.getvalue()


class _HashingFile:
    """A write-only file that hashes what passes through (numpy's generic writer uses it)."""

    def __init__(self, f, h) -> None:
        self.f, self.h = f, h

    def write(self, data) -> int:
        self.h.update(data)
        return self.f.write(data)


def _save_npy(path: Path, array: np.ndarray, fsync: bool = True) -> FileInfo:
    # The checksum is taken from the bytes in memory as they are written, not by reading the
    # file back: one pass over the data instead of three (write, read, hash).
    array = np.ascontiguousarray(array)
    h = hashlib.sha256()
    header = _npy_header(array)
    with atomic_open(path, fsync=fsync) as f:
        if header is None:
            np.lib.format.write_array(_HashingFile(f, h), array, allow_pickle=False)
        else:
            data = array.reshape(-1).view(np.uint8)
            h.update(header)
            h.update(data)
            f.write(header)
            f.write(data)
        size = f.tell()
    return FileInfo(bytes=size, sha256=h.hexdigest())


def write_part(
    part_dir: Path,
    labels: np.ndarray,
    dense: np.ndarray,
    sparse: dict[str, np.ndarray],
    offsets: dict[str, np.ndarray] | None = None,
    *,
    fsync: bool = True,
) -> PartInfo:
    """Write one part's columns; returns what the manifest records of it.

    Args:
        labels: [rows] 0/1 labels.
        dense: [rows, num_dense] transformed dense values.
        sparse: feature name -> ids (one per row, or back to back for multi-hot features).
        offsets: feature name -> int64 [rows + 1] row offsets, for multi-hot features only.
        fsync: flush each file to disk before renaming it. A caller that records the part as
            finished later (preprocess's task marker) may pass False and fsync the files itself
            before that record, off its critical path.
    """
    rows = len(labels)
    if dense.shape[0] != rows:
        raise ValueError(f"dense has {dense.shape[0]} rows, labels {rows}")
    part_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "label.npy": _save_npy(part_dir / "label.npy", labels.astype(np.uint8, copy=False), fsync)
    }
    files["dense.npy"] = _save_npy(part_dir / "dense.npy", dense, fsync)
    offsets = offsets or {}
    for name, ids in sparse.items():
        if name in offsets:
            off = offsets[name].astype(np.int64, copy=False)
            if len(off) != rows + 1 or off[-1] != len(ids):
                raise ValueError(f"{name}: offsets do not match {rows} rows and {len(ids)} ids")
            files[f"{name}.offsets.npy"] = _save_npy(part_dir / f"{name}.offsets.npy", off, fsync)
        elif len(ids) != rows:
            raise ValueError(
                f"{name}: {len(ids)} ids for {rows} rows (one-hot features hold one id per row)"
            )
        files[f"{name}.npy"] = _save_npy(part_dir / f"{name}.npy", ids, fsync)
    return PartInfo(name=part_dir.name, rows=rows, files=files)


@dataclass
class Part:
    """One part's columns, memory-mapped: nothing is read until it is indexed."""

    path: Path
    rows: int
    labels: np.ndarray
    dense: np.ndarray
    sparse: dict[str, np.ndarray]
    offsets: dict[str, np.ndarray]
    limits: dict[str, int] = field(default_factory=dict)
    """Feature name -> table rows: every id of the feature must be below it (the loader checks
    the ids it reads; empty where the layout gives no bound)."""


def _no_symlink_below(directory: Path, part_dir: Path) -> bool:
    """Whether part_dir (directory/split/part, both plain names: _check_names) is reached from
    the dataset directory through no symlink: then only a file that is itself a symlink can lead
    out of the dataset. Two lstats per part, not a realpath per file."""
    return not (os.path.islink(part_dir.parent) or os.path.islink(part_dir))


def check_file(directory: Path, path: str, finfo: FileInfo, plain_dir: bool) -> None:
    """The file exists inside the dataset directory and has the manifest's size. `plain_dir`:
    its folder is reached through no symlink (_no_symlink_below). One lstat for a plain file
    (and no pathlib): a split of Criteo 1TB's ~10,000 parts has 280 K files to check at open."""
    try:
        st = os.lstat(path)
    except OSError:
        st = None
    if st is not None and (not plain_dir or stat.S_ISLNK(st.st_mode)):
        st = os.stat(path) if os.path.isfile(path) else None
        if st is not None:
            inside_dataset(directory, Path(path))
    if st is None or not stat.S_ISREG(st.st_mode):
        raise DatasetError(f"{path}: missing (named by {directory / MANIFEST})")
    if st.st_size != finfo.bytes:
        raise DatasetError(
            f"{path}: {st.st_size} bytes on disk, manifest says {finfo.bytes} (truncated or replaced?)"
        )


def check_part_files(directory: Path, split: str, info: PartInfo) -> None:
    """Cheap checks of a part without opening it: its files exist inside the dataset directory
    with the manifest's sizes (open_part checks dtypes and shapes when the part is mapped)."""
    part_dir = directory / split / info.name
    plain_dir = _no_symlink_below(directory, part_dir)
    folder = str(part_dir) + os.sep
    for fname, finfo in info.files.items():
        path = folder + fname
        # The common case inline (a regular file of the manifest's size in a plain folder): at
        # 280 K files the call and path join per file were ~40% of the check.
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if not (
            plain_dir and st is not None and stat.S_ISREG(st.st_mode) and st.st_size == finfo.bytes
        ):
            check_file(directory, path, finfo, plain_dir)


def _map_column(directory: Path, path: str, finfo: FileInfo, plain_dir: bool) -> np.ndarray:
    """Memory-map one column after checking it exists inside the dataset and has the manifest's
    size."""
    check_file(directory, path, finfo, plain_dir)
    try:
        return map_npy(path)  # no file descriptor stays open: thousands of parts fit any ulimit
    except ValueError as e:
        raise DatasetError(f"{path}: unreadable column: {e}") from e
    except OSError as e:
        raise DatasetError(f"{path}: cannot map: {limit_message(e) or e.strerror}") from None


def _check_layout(path: Path | str, arr: np.ndarray, dtype: str, shape: tuple[int, ...]) -> None:
    """The column's dtype, shape and C order are the manifest's. The gathers read raw rows by
    address and stride, so a column of another width or dtype would be read out of bounds."""
    try:
        want = np.dtype(dtype)
    except TypeError:
        raise DatasetError(
            f"{path}: the manifest gives dtype {shown(dtype)}, which numpy does not know"
        ) from None
    if arr.dtype != want:
        raise DatasetError(f"{path}: dtype {arr.dtype.str}, manifest says {want.str}")
    if arr.shape != shape:
        raise DatasetError(f"{path}: shape {arr.shape}, manifest says {shape}")
    if not arr.flags.c_contiguous:
        raise DatasetError(
            f"{path}: stored in Fortran order, expected C order (as np.save writes by default)"
        )


def _id_dtype(path: Path, feat: SparseFeature) -> str:
    """A feature's id dtype from the manifest, which must be unsigned (ids are row numbers)."""
    try:
        ok = np.dtype(feat.dtype).kind == "u"
    except TypeError:
        ok = False
    if not ok:
        raise DatasetError(
            f"{path}: feature {feat.name} has dtype {shown(feat.dtype)}, expected an unsigned integer type"
        )
    return feat.dtype


def open_part(directory: Path, split: str, info: PartInfo, manifest: Manifest) -> Part:
    """Memory-map one part, with cheap checks: files exist inside the dataset directory, and
    their sizes, dtypes, shapes and order agree with the manifest. The ids are not read here:
    the loader checks those it reads against `Part.limits`."""
    part_dir = directory / split / info.name
    manifest_path = directory / MANIFEST
    plain_dir = _no_symlink_below(directory, part_dir)
    # Paths as strings (a Path per file was ~30% of opening a part, 28 files, ~10,000 parts).
    folder = str(part_dir) + os.sep
    columns = {
        fname: _map_column(directory, folder + fname, finfo, plain_dir)
        for fname, finfo in info.files.items()
    }

    def column(fname: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        if fname not in columns:
            raise DatasetError(
                f"{manifest_path}: part {split}/{info.name} lists no {fname} (files: {', '.join(columns) or 'none'})"
            )
        _check_layout(folder + fname, columns[fname], dtype, shape)
        return columns[fname]

    labels = column("label.npy", "uint8", (info.rows,))
    dense = column("dense.npy", manifest.dense_dtype, (info.rows, len(manifest.dense_features)))
    sparse, offsets = {}, {}
    for feat in manifest.sparse_features:
        dtype = _id_dtype(manifest_path, feat)
        if feat.multi_hot:
            ids = columns.get(f"{feat.name}.npy")
            sparse[feat.name] = column(
                f"{feat.name}.npy", dtype, ids.shape[:1] if ids is not None else ()
            )
            off_name = f"{feat.name}.offsets.npy"
            if (
                off_name in columns
            ):  # its ends first: the message that says what the offsets should be
                _check_offsets(
                    part_dir / off_name, columns[off_name], info.rows, len(sparse[feat.name])
                )
            offsets[feat.name] = column(off_name, "int64", (info.rows + 1,))
        else:
            sparse[feat.name] = column(f"{feat.name}.npy", dtype, (info.rows,))
    limits = {f.name: int(f.cardinality) for f in manifest.sparse_features}
    return Part(part_dir, info.rows, labels, dense, sparse, offsets, limits)


def _check_offsets(path: Path, off: np.ndarray, rows: int, ids: int) -> None:
    """Cheap checks of a multi-hot feature's row offsets (their ends only: a full monotonicity
    pass would read the whole file at every open)."""
    if off.ndim != 1 or len(off) != rows + 1:
        raise DatasetError(f"{path}: {off.shape} offsets, expected {rows + 1} (rows + 1)")
    if int(off[0]) != 0 or int(off[-1]) != ids:
        raise DatasetError(
            f"{path}: offsets run from {int(off[0])} to {int(off[-1])}, expected 0 to {ids} (the feature's ids)"
        )


def open_split(directory: str | Path, split: str, manifest: Manifest | None = None) -> list[Part]:
    """Memory-map every part of one split, checking each against the manifest."""
    directory = Path(directory)
    manifest = manifest or Manifest.load(directory)
    if split not in manifest.splits:
        raise DatasetError(
            f"{directory}: no split {split!r} (has {', '.join(manifest.splits) or 'none'})"
        )
    return [open_part(directory, split, p, manifest) for p in manifest.splits[split].parts]
