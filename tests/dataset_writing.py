"""Datasets written and changed on disk for tests (importable as `dataset_writing`: tests/ is on
sys.path via conftest.py): parts re-cut, a dataset of given rows, a byte of a part changed, and
the layout of datasets written before the current schema.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardrec.dataloader.format.manifest import (
    PART_SUFFIX,
    Manifest,
    SparseFeature,
    SplitInfo,
    smallest_uint,
)
from shardrec.dataloader.format.part_file import (
    file_layout,
    manifest_layout,
    open_part,
    open_split,
    write_part,
)


def resplit(src: Path, dst: Path, parts: int, seed: int = 7) -> None:
    """Write the train rows of the 1-part dataset `src` again as `parts` parts of uneven sizes."""
    manifest = Manifest.load(src)
    whole = open_part(src, "train", manifest.splits["train"].parts[0], manifest)
    rows = whole.rows
    cuts = np.sort(np.random.default_rng(seed).choice(np.arange(1, rows), parts - 1, replace=False))
    bounds = [0, *cuts.tolist(), rows]
    info = SplitInfo(rows=rows)
    for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        sparse = {n: np.asarray(v[a:b]) for n, v in whole.sparse.items()}
        info.parts.append(
            write_part(
                dst / "train" / f"part-{k:05d}{PART_SUFFIX}",
                manifest_layout(manifest),
                np.asarray(whole.labels[a:b]),
                np.asarray(whole.dense[a:b]),
                sparse,
                fsync=False,
            )
        )
    Manifest(manifest.dense_features, manifest.sparse_features, {"train": info}).save(dst)


def write_dataset(
    directory: Path,
    dense_names: list[str],
    cardinalities: dict[str, int],
    splits: dict[str, list[tuple]],
    dense_dtype: str = "float32",
) -> Manifest:
    """A dataset of the given parts: splits maps each split to its parts, each (labels, dense,
    ids by feature) or (labels, dense, ids, offsets by list feature); features one-hot unless
    they have offsets, their id dtype the smallest for their table rows."""
    lists = {n for parts in splits.values() for p in parts if len(p) > 3 for n in p[3]}
    features = [
        SparseFeature(n, c, str(smallest_uint(c - 1)), multi_hot=n in lists)
        for n, c in cardinalities.items()
    ]
    layout = file_layout(dense_names, dense_dtype, features)
    infos = {}
    for split, parts in splits.items():
        written = [
            write_part(directory / split / f"part-{k:05d}{PART_SUFFIX}", layout, *p, fsync=False)
            for k, p in enumerate(parts)
        ]
        infos[split] = SplitInfo(sum(w.rows for w in written), written)
    manifest = Manifest(dense_names, features, infos, dense_dtype)
    manifest.save(directory)
    return manifest


def file_offset(column: np.ndarray) -> int:
    """Where a column of an opened part (a view of its file's map) starts in the file."""
    root = column
    while isinstance(root.base, np.ndarray):
        root = root.base
    return column.ctypes.data - root.ctypes.data


def change_part_byte(directory: Path, split: str, index: int, at: int, record: bool) -> Path:
    """Flip byte `at` of a part's file; with `record`, write its new size and checksum into the
    manifest (as a careless tool or a hostile user would). Returns the file's path."""
    import hashlib
    import json

    manifest = Manifest.load(directory)
    path = directory / split / manifest.splits[split].parts[index].name
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    if record:
        raw = json.loads((directory / "manifest.json").read_text())
        entry = raw["splits"][split]["parts"][index]
        entry.update(bytes=len(data), sha256=hashlib.sha256(bytes(data)).hexdigest())
        (directory / "manifest.json").write_text(json.dumps(raw))
    return path


def old_layout_files(directory: Path) -> dict[str, bytes]:
    """Every column of the dataset as the file the layout of schema versions 1 and 2 held it in
    (`split/part-NNNNN/column.npy`, as np.save writes it: the bytes shardrec wrote before one file
    per part), by relative path, in each part's file order. Digests pinned over the old layout's
    files are taken over these: equal digests prove the same rows, ids and dense values."""
    import io

    manifest = Manifest.load(directory)
    files = {}
    for split in manifest.splits:
        for part in open_split(directory, split, manifest):
            folder = f"{split}/{part.path.name.removesuffix(PART_SUFFIX)}"
            columns = {"label.npy": part.labels, "dense.npy": part.dense}
            for name, ids in part.sparse.items():
                if name in part.offsets:
                    columns[f"{name}.offsets.npy"] = part.offsets[name]
                columns[f"{name}.npy"] = ids
            for fname, column in columns.items():
                out = io.BytesIO()
                np.save(out, np.ascontiguousarray(column))
                files[f"{folder}/{fname}"] = out.getvalue()
    return files


def write_old_layout(src: Path, dst: Path, schema_version: int | None = None) -> dict:
    """Write the dataset `src` again in the layout of schema versions 1 and 2 (old_layout_files)
    with that layout's manifest; returns the manifest as written (JSON)."""
    import hashlib
    import json

    manifest = Manifest.load(src)
    lists = any(f.multi_hot for f in manifest.sparse_features)
    raw = json.loads(manifest.to_json())
    raw["schema_version"] = schema_version or (2 if lists else 1)
    files: dict[str, dict[str, dict]] = {}
    for rel, data in old_layout_files(src).items():
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        (dst / rel).write_bytes(data)
        folder, fname = rel.rsplit("/", 1)
        files.setdefault(folder, {})[fname] = {
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    for split in manifest.splits:
        for entry in raw["splits"][split]["parts"]:
            name = entry["name"].removesuffix(PART_SUFFIX)
            rows = entry["rows"]
            entry.clear()
            entry.update(name=name, rows=rows, files=files[f"{split}/{name}"])
    (dst / "manifest.json").write_text(json.dumps(raw, indent=2) + "\n")
    return raw
