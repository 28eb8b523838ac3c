"""The dataset's manifest: what a dataset directory holds, read and written in one place.

A dataset is a directory::

    DIR/manifest.json
    DIR/<split>/part-00000.arrow     one file per part (part_file.py says what it holds)

The manifest lists every split's parts with their rows, size and SHA-256, the features (names,
table rows, id dtype, list or not, pooling, the planner's statistics), the dense features and
how the rows were preprocessed. Schema version 3 is the one-file-per-part layout; versions 1 and 2
(a folder of 28 `.npy` files per part) are refused in one line naming `shardrec data upgrade DIR`,
which rewrites such a dataset in place (tools/preprocess/derived/dataset_upgrade.py).

The dataset's fingerprints (what a run records to refuse resuming on other data) are computed from
a manifest in fingerprints.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.dataloader.format.raw_ids import RAW
from shardrec.dataloader.util import locks
from shardrec.dataloader.util.files import atomic_write_bytes

FORMAT_NAME = "shardrec-dataset"
SCHEMA_VERSION = 3
"""One Arrow IPC file per part (part_file.py)."""
OLD_VERSIONS = (1, 2)
"""A folder of `.npy` files per part (2: with list features): read only by `shardrec data upgrade`."""
MANIFEST = "manifest.json"
SPLITS = ("train", "val", "test")
DATASET_KINDS = ("rows", "events")
PART_SUFFIX = ".arrow"
POOLING_STAT = "mean_ids_per_sample"
"""A sparse feature's statistic of ids per sample (tools/preprocess/parts/feature_stats.py): the
planner's pooling factor."""


def _why_no_manifest(directory: Path) -> str:
    """Why DIR has no manifest: preprocessing is writing it, stopped before its end, or never ran
    there."""
    if not (directory / locks.WORK_DIR).is_dir():
        # torchrec_npy.py's day files, matched by name here: that module imports this one.
        if directory.is_dir() and any(directory.glob("day_*_dense.npy")):
            return (
                f"{directory}: torchrec's .npy layout (day_N_dense/sparse/labels.npy), not a "
                f"shardrec dataset (no {MANIFEST}); convert it with `shardrec data import-npy "
                f"{directory} --out NEW_DIR`"
            )
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


def _whole(value: Any, where: str) -> int:
    """A count from the manifest: an integer >= 0 (not a bool, a float or a string)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TypeError(f"{where} is {value!r:.80}, expected an integer >= 0")
    return value


@dataclass
class PartInfo:
    """One part as the manifest records it: its file's name in the split's folder, its rows, and
    the file's size and SHA-256."""

    name: str
    rows: int
    bytes: int
    sha256: str

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> PartInfo:
        _expect_dict(raw, where)
        if "files" in raw:
            raise TypeError(f"{where} lists files (the layout of schema versions 1 and 2)")
        if not isinstance(raw.get("sha256"), str):
            raise TypeError(f"{where}.sha256 is {raw.get('sha256')!r:.80}, expected a string")
        return cls(
            raw["name"],
            _whole(raw["rows"], f"{where}.rows"),
            _whole(raw["bytes"], f"{where}.bytes"),
            raw["sha256"],
        )


@dataclass
class SplitInfo:
    rows: int = 0
    parts: list[PartInfo] = field(default_factory=list)


def _check_split_rows(name: str, split: SplitInfo) -> None:
    """A split's rows are its parts' rows: train sizes its epochs by the split's count and the
    loader reads the parts, so a hand-edited count (or a part entry dropped) would train more or
    fewer steps an epoch than the data holds, silently."""
    held = sum(p.rows for p in split.parts)
    if split.rows != held:
        raise TypeError(f"splits.{name}.rows is {split.rows}, but its parts hold {held} rows")


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
    writes it only when it is not sum."""
    sequence: bool = False
    """An ordered run per row, most recent last (a spec's sequence column, an event log's history):
    a sequence model looks it up unpooled; other models pool it by `pooling`."""
    side_of: str = ""
    """A side sequence's primary: the same length as it, row by row (the events' timestamps,
    actions, other ids)."""
    table: str = ""
    """The table it reads where features share one (an event log's history and candidate items
    read `item`); empty: a table of its own."""
    values: str = "ids"
    """ids (rows of a table), timestamps (integer seconds) or integers (raw values such as action
    bits): the last two have no table."""
    ids: str = ""
    """"raw" where the feature holds raw 64-bit ids (format.raw_ids; cardinality 0), "" where its
    ids are table rows. Written only when raw, so other datasets keep their bytes."""
    unsigned: bool = False
    """Raw ids read from a Parquet uint64 column: shown unsigned (the same 64 bits as a log's
    signed -1 and 2^64 - 1 are). Written only when true."""

    @property
    def raw(self) -> bool:
        return self.ids == RAW

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        # Written only where they are not their defaults, so other datasets keep their bytes.
        for key, default in SPARSE_DEFAULTS.items():
            if out[key] == default:
                del out[key]
        return out

    def check(self, where: str) -> None:
        """TypeError naming `where` for values this shardrec does not know."""
        if self.pooling not in ("sum", "mean"):
            raise TypeError(f"{where}.pooling is {self.pooling!r}, expected sum or mean")
        if self.values not in FEATURE_VALUES:
            raise TypeError(
                f"{where}.values is {self.values!r}, expected one of {', '.join(FEATURE_VALUES)}"
            )
        if self.ids not in ("", RAW):
            raise TypeError(f"{where}.ids is {self.ids!r}, expected {RAW!r} or none")
        if not isinstance(self.unsigned, bool):
            raise TypeError(f"{where}.unsigned is {self.unsigned!r}, expected true or false")


FEATURE_VALUES = ("ids", "timestamps", "integers")
"""What a sparse feature's values are: table rows, or raw integers that no table holds."""
SPARSE_DEFAULTS = {
    "pooling": "sum",
    "sequence": False,
    "side_of": "",
    "table": "",
    "values": "ids",
    "ids": "",
    "unsigned": False,
}


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
    lists_cut: dict[str, dict[str, int]] = field(default_factory=dict)
    """List columns whose kept rows held more than max_length values: {max_length, rows, values
    left out}; written only where a list was cut."""
    schema_version: int = SCHEMA_VERSION
    format: str = FORMAT_NAME
    kind: str = "rows"
    """rows (one sample per row, in parts), or events: an event log's users, their time-sorted
    events and the anchors that are its samples (dataloader/events/event_files.py)."""
    events: dict[str, Any] = field(default_factory=dict)
    """An event-log dataset's files, windows and the spec its samples were made with
    (dataloader.events.event_files.EventsInfo); empty for rows."""
    upgraded_from: dict[str, Any] = field(default_factory=dict)
    """Written by `shardrec data upgrade`: the old layout's schema version and fingerprints, and
    this dataset's own as the upgrade wrote it (`fingerprints.dataset_fingerprint` returns the old
    ones while the parts are the ones the upgrade wrote). Empty for a dataset written in this
    layout."""

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
        if self.kind == "rows":  # other datasets keep their bytes
            del out["kind"], out["events"]
        if not self.upgraded_from:
            del out["upgraded_from"]
        if not self.lists_cut:  # the manifests of datasets with no list cut keep their bytes
            del out["lists_cut"]
        return json.dumps(out, indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_dict(
        cls, raw: dict[str, Any], part: Callable[[Any, str], Any] = PartInfo.from_dict
    ) -> Manifest:
        """Build from parsed JSON; KeyError or TypeError (naming the entry) if it is malformed.
        `part` reads one part's entry (the upgrade reads the old layout's with its own)."""
        _expect_dict(raw.get("splits"), "splits")
        splits = {}
        for name, s in raw["splits"].items():
            _expect_dict(s, f"splits.{name}")
            if not isinstance(s.get("parts"), list):
                raise TypeError(
                    f"splits.{name}.parts is {s.get('parts')!r}, expected a list of parts"
                )
            parts = [part(p, f"splits.{name}.parts[{i}]") for i, p in enumerate(s["parts"])]
            splits[name] = SplitInfo(rows=_whole(s["rows"], f"splits.{name}.rows"), parts=parts)
            if raw.get("kind", "rows") == "rows":
                _check_split_rows(name, splits[name])
        features = [SparseFeature(**f) for f in raw["sparse_features"]]
        for i, f in enumerate(features):
            f.check(f"sparse_features[{i}]")
        rest = {k: v for k, v in raw.items() if k not in ("splits", "sparse_features")}
        if rest.get("kind", "rows") not in DATASET_KINDS:
            raise TypeError(f"kind is {rest['kind']!r:.40}, expected {' or '.join(DATASET_KINDS)}")
        return cls(sparse_features=features, splits=splits, **rest)

    @classmethod
    def load(cls, directory: str | Path) -> Manifest:
        """Read DIR/manifest.json; DatasetError names the path if it is not a shardrec dataset of
        this layout (an old layout's names the upgrade command)."""
        raw, path = read_raw(directory)
        version = raw.get("schema_version")
        if version in OLD_VERSIONS and not isinstance(version, bool):
            raise DatasetError(
                f"{path}: schema_version {version}, the layout of a folder of .npy files per part, "
                f"which this shardrec no longer reads; {upgrade_advice(directory)}"
            )
        if version != SCHEMA_VERSION or isinstance(version, bool):
            raise DatasetError(
                f"{path}: schema_version {shown(version)} is not supported (this shardrec reads "
                f"{SCHEMA_VERSION}, and upgrades {' and '.join(map(str, OLD_VERSIONS))})"
            )
        try:
            with _no_cyclic_gc():
                manifest = cls.from_dict(raw)
        except (KeyError, TypeError, AttributeError) as e:
            raise DatasetError(f"{path}: malformed manifest: {e}") from e
        check_names(path, manifest)
        return manifest

    def save(self, directory: str | Path) -> None:
        atomic_write_bytes(Path(directory) / MANIFEST, self.to_json().encode())


def upgrade_advice(directory: str | Path) -> str:
    """What to do with a dataset of the old layout: `data upgrade` rewrites it in place, which
    a read-only folder (a read-only mount, another user's) does not allow: then its copy."""
    if os.access(directory, os.W_OK):
        return (
            "rewrite it in place (one file per part, checksums checked) with "
            f"`shardrec data upgrade {directory}`"
        )
    return (
        "its folder is read-only, so copy the dataset somewhere writable and rewrite the copy "
        "(one file per part, checksums checked) with `shardrec data upgrade COPY`"
    )


def read_raw(directory: str | Path) -> tuple[dict[str, Any], Path]:
    """DIR/manifest.json parsed, of shardrec's format (any schema version), and its path."""
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
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: unreadable manifest: {e}") from e
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
        found = raw.get("format") if isinstance(raw, dict) else raw
        raise DatasetError(f"{path}: format is {shown(found)}, expected {FORMAT_NAME!r}")
    return raw, path


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


def is_plain_name(name: Any) -> bool:
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


def check_names(path: Path, manifest: Manifest, suffix: str = PART_SUFFIX) -> None:
    """Every split and part name the manifest gives is a plain name (parts: ending in `suffix`),
    so that the paths built from them stay inside the dataset directory (`../`, absolute paths;
    symlinks are checked as each file is opened, dataset_files.inside_dataset), and none is listed
    twice in its split: the loader would read its rows twice an epoch, and `data verify` check it
    twice."""
    for split, info in manifest.splits.items():
        if not is_plain_name(split):
            raise DatasetError(
                f"{path}: split name {shown(split)} is not a plain name inside the dataset directory"
            )
        seen: set[str] = set()
        for part in info.parts:
            if part.name in seen:
                raise DatasetError(
                    f"{path}: part {shown(part.name)} of split {split!r} is listed twice, so its "
                    "rows would be read twice an epoch; re-run the command that made the dataset, "
                    "into it, to write its manifest again"
                )
            seen.add(part.name)
            if not is_plain_name(part.name):
                raise DatasetError(
                    f"{path}: part {shown(part.name)} of split {split!r} is not a plain name "
                    "inside the dataset directory"
                )
            if not part.name.endswith(suffix):
                raise DatasetError(
                    f"{path}: part {shown(part.name)} of split {split!r} is not a {suffix} file"
                )


def _expect_dict(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise TypeError(f"{where} is {value!r:.80}, expected an object")
