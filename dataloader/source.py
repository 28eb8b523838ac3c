"""Open a split for reading, whichever on-disk layout holds it.

Two layouts are read, both memory-mapped (resident memory does not grow with dataset size):
shardrec's own format (dataloader/format.py; a directory with manifest.json) and torchrec's
`day_N_{dense,sparse,labels}.npy` layout (dataloader/torchrec_npy.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

from shardrec.dataloader.format import MANIFEST, DatasetError, Manifest, Part, open_split


@dataclass
class SplitSource:
    """One split, memory-mapped, with what the loader needs to know about it."""

    directory: Path
    split: str
    parts: list[Part]
    feature_names: list[str]
    multi_hot: set[str] = field(default_factory=set)
    modulo: dict[str, int] = field(default_factory=dict)
    """Feature name -> hash size, for layouts whose raw ids must be folded into a table."""
    fingerprint: str = ""
    """Identifies the data (files and sizes), so a resume on other data is refused."""

    @property
    def part_rows(self) -> tuple[int, ...]:
        return tuple(p.rows for p in self.parts)

    @property
    def num_samples(self) -> int:
        return sum(self.part_rows)


def open_source(directory: str | Path, split: str, hashes: list[int] | None = None) -> SplitSource:
    """Open `split` of a shardrec dataset, or of a torchrec day_N_*.npy directory.

    Raises:
        DatasetError: missing directory/files, sizes disagreeing with the manifest, empty split.
    """
    directory = Path(directory)
    if not (directory / MANIFEST).is_file():
        from shardrec.dataloader.torchrec_npy import is_torchrec_npy_dir, open_torchrec_npy

        if is_torchrec_npy_dir(directory):
            source = open_torchrec_npy(directory, split, hashes=hashes)
            _check_not_empty(source)
            return source
    manifest = Manifest.load(directory)
    parts = open_split(directory, split, manifest)
    h = hashlib.sha256()
    for info in manifest.splits[split].parts:
        h.update(f"{info.name}:{info.rows}:".encode())
        for fname, finfo in sorted(info.files.items()):
            h.update(f"{fname}:{finfo.bytes}:{finfo.sha256};".encode())
    source = SplitSource(
        directory=directory,
        split=split,
        parts=parts,
        feature_names=manifest.feature_names,
        multi_hot={f.name for f in manifest.sparse_features if f.multi_hot},
        fingerprint=h.hexdigest(),
    )
    _check_not_empty(source)
    return source


def _check_not_empty(source: SplitSource) -> None:
    if source.num_samples == 0:
        raise DatasetError(f"{source.directory}: split {source.split!r} has no rows")
