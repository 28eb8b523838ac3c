"""Open a split for reading, whichever on-disk layout holds it.

Two layouts are read, both memory-mapped (resident memory does not grow with dataset size):
shardrec's own format (dataloader/format/manifest.py and part_file.py; a directory with
manifest.json) and torchrec's
`day_N_{dense,sparse,labels}.npy` layout (dataloader/format/torchrec_npy.py describes it), read in
place with torchrec's splits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shardrec.dataloader.format import torchrec_npy as npy
from shardrec.dataloader.format.fingerprints import split_fingerprint
from shardrec.dataloader.format.manifest import MANIFEST, DatasetError, Manifest, read_raw
from shardrec.dataloader.format.part_cache import PartSet, part_rows
from shardrec.dataloader.format.part_file import Part


@dataclass
class SplitSource:
    """One split, memory-mapped, with what the loader needs to know about it."""

    directory: Path
    split: str
    parts: Sequence[Part]
    """The parts: a PartSet (mapped on use, a bounded number at a time) or a list."""
    feature_names: list[str]
    multi_hot: set[str] = field(default_factory=set)
    modulo: dict[str, int] = field(default_factory=dict)
    """Feature name -> hash size, for layouts whose raw ids must be folded into a table."""
    fingerprint: str = ""
    """Identifies the data (files and sizes), so a resume on other data is refused."""

    @property
    def part_rows(self) -> tuple[int, ...]:
        return part_rows(self.parts)

    @property
    def num_samples(self) -> int:
        return sum(self.part_rows)


def check_dataset_dir(directory: str | Path) -> None:
    """DatasetError unless `directory` holds a layout open_source reads (a manifest.json, or
    torchrec's day files), with its one-line reason: does not exist, not a directory, no
    manifest. Cheap and light: a command refuses a wrong path before it imports torchrec."""
    directory = Path(directory)
    if not (directory / MANIFEST).is_file() and not npy.is_torchrec_npy_dir(directory):
        read_raw(directory)  # no manifest.json: raises why


def open_source(
    directory: str | Path,
    split: str,
    hashes: list[int] | None = None,
    max_mapped_parts: int | None = None,
) -> SplitSource:
    """Open `split` of a shardrec dataset, or of a torchrec day_N_*.npy directory.

    `max_mapped_parts`: parts of a shardrec dataset kept mapped at once (None: bounded only
    by the process-wide map budget, part_cache.py); any number of parts can be read.

    Raises:
        DatasetError: missing directory/files, sizes disagreeing with the manifest, empty split.
    """
    directory = Path(directory)
    if not (directory / MANIFEST).is_file():
        if npy.is_torchrec_npy_dir(directory):
            source = open_torchrec_npy(directory, split, hashes=hashes)
            _check_not_empty(source)
            return source
    manifest = Manifest.load(directory)
    parts = PartSet(directory, split, manifest, max_mapped_parts)
    source = SplitSource(
        directory=directory,
        split=split,
        parts=parts,
        feature_names=manifest.feature_names,
        multi_hot={f.name for f in manifest.sparse_features if f.multi_hot},
        fingerprint=split_fingerprint(manifest, split),
    )
    _check_not_empty(source)
    return source


def _check_not_empty(source: SplitSource) -> None:
    if source.num_samples == 0:
        raise DatasetError(f"{source.directory}: split {source.split!r} has no rows")


def _npy_part(
    directory: Path, day: int, arrays: npy.Day, start: int = 0, stop: int | None = None
) -> Part:
    """Rows [start, stop) of one day as a Part whose columns are torchrec's names."""
    stop = arrays.rows if stop is None else stop
    sparse = arrays.sparse[start:stop]
    names = npy.feature_names(sparse.shape[1])
    columns = {n: sparse[:, i] for i, n in enumerate(names)}
    return Part(
        directory / f"day_{day}",
        stop - start,
        arrays.labels[start:stop],
        arrays.dense[start:stop],
        columns,
        {},
    )


def open_torchrec_npy(
    directory: str | Path, split: str, hashes: list[int] | int | None = None
) -> SplitSource:
    """Memory-map one split of a torchrec day_N_*.npy directory (torchrec's split convention;
    shardrec's export records its own cut of the last day, npy.last_day_val_rows)."""
    directory = Path(directory)
    days = npy.day_numbers(directory)
    if not days:
        raise DatasetError(f"{directory}: no day_N_dense.npy files")
    if split == "train":
        parts = [
            _npy_part(directory, d, npy.open_day(directory, d))
            for d in (days[:-1] if len(days) > 1 else days)
        ]
    elif split in ("val", "test"):
        if len(days) < 2:
            raise DatasetError(
                f"{directory}: split {split!r} needs at least 2 days (the last day is halved into val/test)"
            )
        last = npy.open_day(directory, days[-1])
        half = npy.last_day_val_rows(directory, days[-1], last.rows)
        parts = [
            _npy_part(directory, days[-1], last, 0, half)
            if split == "val"
            else _npy_part(directory, days[-1], last, half)
        ]
    else:
        raise DatasetError(
            f"{directory}: no split {split!r} (torchrec layout has train, val, test)"
        )
    names = list(parts[0].sparse)
    if any(list(p.sparse) != names or p.dense.shape[1] != parts[0].dense.shape[1] for p in parts):
        raise DatasetError(f"{directory}: days disagree on the number of dense or sparse columns")
    modulo: dict[str, int] = {}
    if hashes is not None:
        sizes = [hashes] * len(names) if isinstance(hashes, int) else list(hashes)
        if len(sizes) != len(names) or any(h <= 0 for h in sizes):
            raise ValueError(
                f"hashes must be one positive size or {len(names)} of them, got {hashes}"
            )
        modulo = dict(zip(names, sizes))
    h = hashlib.sha256(f"torchrec-npy:{split}:{hashes}".encode())
    for d in days:
        for kind in npy.KINDS:
            path = npy.day_file(directory, d, kind)
            h.update(f"{path.name}:{path.stat().st_size};".encode())
    return SplitSource(directory, split, parts, names, set(), modulo, h.hexdigest())
