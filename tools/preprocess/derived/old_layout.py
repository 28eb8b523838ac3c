"""The dataset layout of schema versions 1 and 2, read only to upgrade it (dataset_upgrade.py).

A part was a folder of `.npy` files, each listed in the manifest with its size and SHA-256::

    DIR/<split>/part-00000/label.npy        uint8 [rows]
    DIR/<split>/part-00000/dense.npy        float32 or float16 [rows, num_dense]
    DIR/<split>/part-00000/<feature>.npy    the feature's id dtype [rows], or its ids back to back
    DIR/<split>/part-00000/<feature>.offsets.npy   int64 [rows + 1], list features only

Version 2 was version 1 with list features. Reading a part here checks what the loader of that
layout checked (files inside the dataset, their sizes, dtypes, shapes and order, the ends of list
offsets) and every file's SHA-256 against the manifest: the upgrade copies only bytes that are the
ones recorded. The fingerprints of that layout are computed here as its code computed them, so an
upgraded dataset can keep them (fingerprints.upgrade_record).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.dataloader.format.dataset_files import file_sha256, inside_dataset
from shardrec.dataloader.format.manifest import (
    MANIFEST,
    OLD_VERSIONS,
    DatasetError,
    Manifest,
    check_names,
    is_plain_name,
    read_raw,
    shown,
)
from shardrec.dataloader.format.part_file import Part
from shardrec.dataloader.util.mapping import limit_message, map_npy


@dataclass
class OldFile:
    bytes: int
    sha256: str


@dataclass
class OldPart:
    """A part of the old layout: its folder's name, rows, and each file's size and SHA-256."""

    name: str
    rows: int
    files: dict[str, OldFile]

    @classmethod
    def from_dict(cls, raw: Any, where: str) -> OldPart:
        if not isinstance(raw, dict) or not isinstance(raw.get("files"), dict):
            raise TypeError(f"{where}.files is {shown(raw)}, expected an object")
        files = {}
        for name, f in raw["files"].items():
            if not is_plain_name(name):
                raise TypeError(
                    f"{where} lists file {shown(name)}, not a plain name inside the part"
                )
            if not isinstance(f, dict) or not isinstance(f.get("bytes"), int):
                raise TypeError(f"{where}.files[{name!r}] is {shown(f)}, expected bytes and sha256")
            files[name] = OldFile(f["bytes"], str(f.get("sha256")))
        if not isinstance(raw.get("rows"), int) or isinstance(raw["rows"], bool):
            raise TypeError(f"{where}.rows is {shown(raw.get('rows'))}, expected an integer")
        return cls(raw["name"], raw["rows"], files)


def load_old(directory: Path) -> tuple[Manifest, int] | None:
    """(the manifest, its schema version) of a dataset of the old layout; None for a dataset of
    the current one. DatasetError for anything else."""
    raw, path = read_raw(directory)
    version = raw.get("schema_version")
    if version not in OLD_VERSIONS or isinstance(version, bool):
        Manifest.load(directory)  # the current layout (None below), or its own error
        return None
    try:
        manifest = Manifest.from_dict({**raw, "schema_version": version}, part=OldPart.from_dict)
    except (KeyError, TypeError, AttributeError) as e:
        raise DatasetError(f"{path}: malformed manifest: {e}") from e
    check_names(path, manifest, suffix="")
    return manifest, version


def old_fingerprint(manifest: Manifest) -> str:
    """The dataset fingerprint of the old layout (runs of that layout recorded it)."""
    content = {
        "dense": manifest.dense_features,
        "sparse": [(f.name, f.cardinality, f.multi_hot) for f in manifest.sparse_features],
        "splits": {
            name: [
                (p.name, p.rows, sorted((k, v.sha256) for k, v in p.files.items()))
                for p in split.parts
            ]
            for name, split in sorted(manifest.splits.items())
        },
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def old_split_fingerprint(manifest: Manifest, split: str) -> str:
    """A split's fingerprint in the old layout (its loader's stream state recorded it)."""
    h = hashlib.sha256()
    for info in manifest.splits[split].parts:
        h.update(f"{info.name}:{info.rows}:".encode())
        for fname, finfo in sorted(info.files.items()):
            h.update(f"{fname}:{finfo.bytes}:{finfo.sha256};".encode())
    return h.hexdigest()


def _column(directory: Path, path: Path, info: OldFile) -> np.ndarray:
    """One column, mapped, once it is inside the dataset with the manifest's size and checksum."""
    if not path.is_file():
        raise DatasetError(f"{path}: missing (named by {directory / MANIFEST})")
    inside_dataset(directory, path)
    size = path.stat().st_size
    if size != info.bytes:
        raise DatasetError(
            f"{path}: {size} bytes on disk, manifest says {info.bytes} (truncated or replaced?)"
        )
    if file_sha256(path) != info.sha256:
        raise DatasetError(
            f"{path}: checksum differs from the manifest (changed since it was written); "
            "restore it or preprocess the data again"
        )
    try:
        return map_npy(path)
    except ValueError as e:
        raise DatasetError(f"{path}: unreadable column: {e}") from e
    except OSError as e:
        raise DatasetError(f"{path}: cannot map: {limit_message(e) or e.strerror}") from None


def _checked(path: Path, arr: np.ndarray, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """The column's dtype, shape and C order are the manifest's."""
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
        raise DatasetError(f"{path}: stored in Fortran order, expected C order")
    return arr


def read_old_part(directory: Path, split: str, info: OldPart, manifest: Manifest) -> Part:
    """An old part's columns, mapped, after every check its layout's loader made and each file's
    SHA-256 against the manifest."""
    folder = directory / split / info.name
    if os.path.islink(folder.parent) or os.path.islink(folder):
        inside_dataset(directory, folder)

    def column(fname: str, dtype: str, shape: tuple[int, ...] | None) -> np.ndarray:
        if fname not in info.files:
            raise DatasetError(
                f"{directory / MANIFEST}: part {split}/{info.name} lists no {fname} "
                f"(files: {', '.join(info.files) or 'none'})"
            )
        arr = _column(directory, folder / fname, info.files[fname])
        return _checked(folder / fname, arr, dtype, arr.shape[:1] if shape is None else shape)

    labels = column("label.npy", "uint8", (info.rows,))
    dense = column("dense.npy", manifest.dense_dtype, (info.rows, len(manifest.dense_features)))
    sparse, offsets = {}, {}
    for feat in manifest.sparse_features:
        try:
            unsigned = np.dtype(feat.dtype).kind == "u"
        except TypeError:
            unsigned = False
        if not unsigned:
            raise DatasetError(
                f"{directory / MANIFEST}: feature {feat.name} has dtype {shown(feat.dtype)}, "
                "expected an unsigned integer type"
            )
        if feat.multi_hot:
            ids = column(f"{feat.name}.npy", feat.dtype, None)
            off = column(f"{feat.name}.offsets.npy", "int64", (info.rows + 1,))
            if int(off[0]) != 0 or int(off[-1]) != len(ids):
                raise DatasetError(
                    f"{folder / (feat.name + '.offsets.npy')}: offsets run from {int(off[0])} to "
                    f"{int(off[-1])}, expected 0 to {len(ids)} (the feature's ids)"
                )
            sparse[feat.name], offsets[feat.name] = ids, off
        else:
            sparse[feat.name] = column(f"{feat.name}.npy", feat.dtype, (info.rows,))
    limits = {f.name: int(f.cardinality) for f in manifest.sparse_features}
    return Part(folder, info.rows, labels, dense, sparse, offsets, limits)
