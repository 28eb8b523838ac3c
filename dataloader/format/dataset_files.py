"""A dataset's files as its readers open them: a path kept inside the dataset directory (no
symlink leads a reader out of it) and a file's SHA-256, the checksum the manifest records."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from shardrec.dataloader.format.manifest import MANIFEST, DatasetError


@functools.lru_cache(maxsize=64)
def _resolved(directory: Path) -> Path:
    # Resolved once per dataset directory, not for each part (part opens are on the loader's path
    # whenever a part is mapped again after eviction).
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


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    """SHA-256 of a file, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
