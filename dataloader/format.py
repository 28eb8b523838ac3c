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
to a temporary name and renamed (dataloader/files.py), and the manifest records the size and SHA-256 of each.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.dataloader.files import atomic_open, atomic_write_bytes

FORMAT_NAME = "shardrec-dataset"
SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "val", "test")


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
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "Manifest":
        """Build from parsed JSON; KeyError or TypeError (naming the entry) if it is malformed."""
        _expect_dict(raw.get("splits"), "splits")
        for name, s in raw["splits"].items():
            _expect_dict(s, f"splits.{name}")
            if not isinstance(s.get("parts"), list):
                raise TypeError(f"splits.{name}.parts is {s.get('parts')!r}, expected a list of parts")
            for i, p in enumerate(s["parts"]):
                _expect_dict(p, f"splits.{name}.parts[{i}]")
                _expect_dict(p.get("files"), f"splits.{name}.parts[{i}].files")
        splits = {
            name: SplitInfo(
                rows=s["rows"],
                parts=[
                    PartInfo(p["name"], p["rows"], {k: FileInfo(**v) for k, v in p["files"].items()})
                    for p in s["parts"]
                ],
            )
            for name, s in raw["splits"].items()
        }
        features = [SparseFeature(**f) for f in raw["sparse_features"]]
        rest = {k: v for k, v in raw.items() if k not in ("splits", "sparse_features")}
        return cls(sparse_features=features, splits=splits, **rest)

    @classmethod
    def load(cls, directory: str | Path) -> "Manifest":
        """Read DIR/manifest.json; DatasetError names the path if it is not a shardrec dataset."""
        path = Path(directory) / MANIFEST
        if not Path(directory).is_dir():
            raise DatasetError(f"{directory}: not a directory")
        if not path.is_file():
            raise DatasetError(f"{directory}: not a shardrec dataset (no {MANIFEST}); create one with `shardrec preprocess`")
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise DatasetError(f"{path}: unreadable manifest: {e}") from e
        if raw.get("format") != FORMAT_NAME:
            raise DatasetError(f"{path}: format is {raw.get('format')!r}, expected {FORMAT_NAME!r}")
        if raw.get("schema_version") != SCHEMA_VERSION:
            raise DatasetError(
                f"{path}: schema_version {raw.get('schema_version')} is not supported (this shardrec reads {SCHEMA_VERSION})"
            )
        try:
            return cls.from_dict(raw)
        except (KeyError, TypeError, AttributeError) as e:
            raise DatasetError(f"{path}: malformed manifest: {e}") from e

    def save(self, directory: str | Path) -> None:
        atomic_write_bytes(Path(directory) / MANIFEST, self.to_json().encode())


def _expect_dict(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise TypeError(f"{where} is {value!r:.80}, expected an object")


def read_json(path: Path, what: str) -> Any:
    """Parse a JSON file; ValueError naming the file and what it should have been."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"{path}: cannot read {what}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a JSON {what}: {e}") from None


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
    files = {"label.npy": _save_npy(part_dir / "label.npy", labels.astype(np.uint8, copy=False), fsync)}
    files["dense.npy"] = _save_npy(part_dir / "dense.npy", dense, fsync)
    offsets = offsets or {}
    for name, ids in sparse.items():
        if name in offsets:
            off = offsets[name].astype(np.int64, copy=False)
            if len(off) != rows + 1 or off[-1] != len(ids):
                raise ValueError(f"{name}: offsets do not match {rows} rows and {len(ids)} ids")
            files[f"{name}.offsets.npy"] = _save_npy(part_dir / f"{name}.offsets.npy", off, fsync)
        elif len(ids) != rows:
            raise ValueError(f"{name}: {len(ids)} ids for {rows} rows (one-hot features hold one id per row)")
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


def open_part(directory: Path, split: str, info: PartInfo, manifest: Manifest) -> Part:
    """Memory-map one part, with cheap checks (files exist, sizes and row counts agree)."""
    part_dir = directory / split / info.name
    columns: dict[str, np.ndarray] = {}
    for fname, finfo in info.files.items():
        path = part_dir / fname
        if not path.is_file():
            raise DatasetError(f"{path}: missing (named by {directory / MANIFEST})")
        size = path.stat().st_size
        if size != finfo.bytes:
            raise DatasetError(f"{path}: {size} bytes on disk, manifest says {finfo.bytes} (truncated or replaced?)")
        try:
            columns[fname] = np.load(path, mmap_mode="r", allow_pickle=False)
        except ValueError as e:
            raise DatasetError(f"{path}: unreadable column: {e}") from e
    def column(fname: str) -> np.ndarray:
        if fname not in columns:
            raise DatasetError(f"{directory / MANIFEST}: part {split}/{info.name} lists no {fname} (files: {', '.join(columns) or 'none'})")
        return columns[fname]

    labels, dense = column("label.npy"), column("dense.npy")
    for name, arr in (("label.npy", labels), ("dense.npy", dense)):
        if arr.shape[0] != info.rows:
            raise DatasetError(f"{part_dir / name}: {arr.shape[0]} rows, manifest says {info.rows}")
    sparse, offsets = {}, {}
    for feat in manifest.sparse_features:
        sparse[feat.name] = column(f"{feat.name}.npy")
        if feat.multi_hot:
            offsets[feat.name] = column(f"{feat.name}.offsets.npy")
            _check_offsets(part_dir / f"{feat.name}.offsets.npy", offsets[feat.name], info.rows, len(sparse[feat.name]))
        elif sparse[feat.name].shape[0] != info.rows:
            raise DatasetError(f"{part_dir / (feat.name + '.npy')}: {sparse[feat.name].shape[0]} rows, manifest says {info.rows}")
    return Part(part_dir, info.rows, labels, dense, sparse, offsets)


def _check_offsets(path: Path, off: np.ndarray, rows: int, ids: int) -> None:
    """Cheap checks of a multi-hot feature's row offsets (their ends only: a full monotonicity
    pass would read the whole file at every open)."""
    if off.ndim != 1 or len(off) != rows + 1:
        raise DatasetError(f"{path}: {off.shape} offsets, expected {rows + 1} (rows + 1)")
    if int(off[0]) != 0 or int(off[-1]) != ids:
        raise DatasetError(f"{path}: offsets run from {int(off[0])} to {int(off[-1])}, expected 0 to {ids} (the feature's ids)")


def open_split(directory: str | Path, split: str, manifest: Manifest | None = None) -> list[Part]:
    """Memory-map every part of one split, checking each against the manifest."""
    directory = Path(directory)
    manifest = manifest or Manifest.load(directory)
    if split not in manifest.splits:
        raise DatasetError(f"{directory}: no split {split!r} (has {', '.join(manifest.splits) or 'none'})")
    return [open_part(directory, split, p, manifest) for p in manifest.splits[split].parts]


def verify(directory: str | Path) -> list[str]:
    """Check every file's checksum against the manifest; returns one message per problem."""
    directory = Path(directory)
    manifest = Manifest.load(directory)
    problems = []
    for split, info in manifest.splits.items():
        for part in info.parts:
            for fname, finfo in part.files.items():
                path = directory / split / part.name / fname
                if not path.is_file():
                    problems.append(f"{path}: missing")
                elif path.stat().st_size != finfo.bytes:
                    problems.append(f"{path}: {path.stat().st_size} bytes, manifest says {finfo.bytes}")
                elif file_sha256(path) != finfo.sha256:
                    problems.append(f"{path}: checksum differs from the manifest")
    return problems
