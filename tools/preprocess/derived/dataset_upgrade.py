"""`shardrec data upgrade DIR`: a dataset of the old layout (a folder of `.npy` files per part,
schema versions 1 and 2) rewritten in place as one Arrow IPC file per part (schema version 3).

Per part, the old files are checked (sizes, checksums, dtypes, shapes: old_layout.py), their
columns written into `DIR/<split>/<part>.arrow` through a temporary name (synced, renamed), and
the part noted in a progress log. Only when every part is written is the new manifest written
(the commit: one atomic rename); then the old folders are removed. Until the commit the old
dataset is whole and the new files are beside it (the disk must hold both for a moment); a run
interrupted at any point (Ctrl-C, a kill, a full disk) is finished by running the command again,
which skips the parts already written and removes what the interrupted run left.

The rows are the same, so the upgraded manifest keeps the old layout's fingerprints
(fingerprints.upgrade_record): runs trained on the old layout resume on the upgraded dataset, and
`data digest` prints the same batches.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from shardrec.dataloader.format.fingerprints import upgrade_record
from shardrec.dataloader.format.manifest import (
    MANIFEST,
    PART_SUFFIX,
    SCHEMA_VERSION,
    Manifest,
    PartInfo,
    SplitInfo,
)
from shardrec.dataloader.format.part_file import manifest_layout, open_part, write_part
from shardrec.dataloader.util import locks
from shardrec.dataloader.util.files import atomic_write_bytes, fsync_dir
from shardrec.tools.preprocess.derived.old_layout import (
    load_old,
    old_fingerprint,
    old_split_fingerprint,
    read_old_part,
)

logger = logging.getLogger(__name__)
UPGRADE_DIR = "upgrade"
"""Inside the dataset's WORK_DIR: the progress log and the old manifest until the old folders are
gone."""


@dataclass
class UpgradeResult:
    directory: str
    from_version: int | None
    """None: the dataset was already of the current layout (only leftovers were removed)."""
    parts: int = 0
    parts_written: int = 0
    """Parts written by this run (the others were written by an interrupted one)."""
    bytes: int = 0
    rows: int = 0


def _as_it_is(directory: Path) -> UpgradeResult:
    """The result for a dataset already of the current layout: its parts, rows and bytes as its
    manifest lists them, none written now."""
    parts = [p for info in Manifest.load(directory).splits.values() for p in info.parts]
    return UpgradeResult(
        str(directory),
        None,
        parts=len(parts),
        bytes=sum(p.bytes for p in parts),
        rows=sum(p.rows for p in parts),
    )


def _work(directory: Path) -> Path:
    return directory / locks.WORK_DIR / UPGRADE_DIR


def _done(directory: Path) -> dict[tuple[str, str], PartInfo]:
    """The parts an interrupted run finished, whose files are still there at their size."""
    log = _work(directory) / "done.jsonl"
    done = {}
    try:
        lines = log.read_text().splitlines()
    except OSError:
        return done
    for line in lines:
        try:
            entry = json.loads(line)
            info = PartInfo(**entry["part"])
            path = directory / entry["split"] / info.name
            if path.is_file() and path.stat().st_size == info.bytes:
                done[(entry["split"], entry["old"])] = info
        except (ValueError, TypeError, KeyError, OSError):
            continue  # a line torn by a kill: that part is written again
    return done


def _note(directory: Path, split: str, old: str, info: PartInfo) -> None:
    log = _work(directory) / "done.jsonl"
    with open(log, "a") as f:
        f.write(json.dumps({"split": split, "old": old, "part": asdict(info)}) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _remove_temporaries(directory: Path, splits: list[str]) -> None:
    for split in splits:
        for p in (directory / split).glob(f".*{PART_SUFFIX}.tmp-*"):
            p.unlink(missing_ok=True)


def _remove_old(directory: Path) -> None:
    """The old parts' folders named by the old manifest kept in WORK_DIR, then that record."""
    kept = _work(directory) / MANIFEST
    if kept.is_file():
        old = json.loads(kept.read_text())
        for split, info in old.get("splits", {}).items():
            for part in info.get("parts", []):
                folder = directory / split / part["name"]
                # names were checked as plain by load_old before this record was written
                if folder.is_dir() and not folder.is_symlink():
                    shutil.rmtree(folder)
                elif folder.is_symlink():
                    folder.unlink()
    shutil.rmtree(_work(directory), ignore_errors=True)
    work = directory / locks.WORK_DIR
    if work.is_dir() and not any(p.name != locks.DATASET_LOCK for p in work.iterdir()):
        shutil.rmtree(work, ignore_errors=True)


def upgrade_dataset(
    directory: str | Path, on_part: Callable[[int], None] | None = None
) -> UpgradeResult:
    """Rewrite the dataset in `directory` in the current layout, in place (module doc).

    on_part: called with each part's rows once it is written (progress).
    Raises DatasetError (a file that is missing, resized or not its checksum: nothing is
    changed but finished parts kept for the next run) or ValueError (another process is writing
    the dataset)."""
    directory = Path(directory)
    old = load_old(directory)
    if old is None and not _work(directory).exists():
        # already upgraded, nothing left to remove: no lock, which a read-only folder refuses
        return _as_it_is(directory)
    lock = locks.dataset_lock(directory, command="shardrec data upgrade")
    try:
        if old is None:
            _remove_old(directory)  # an upgrade interrupted after its commit
            return _as_it_is(directory)
        manifest, version = old
        _work(directory).mkdir(parents=True, exist_ok=True)
        _remove_temporaries(directory, list(manifest.splits))
        done = _done(directory)
        layout = manifest_layout(manifest, directory)
        result = UpgradeResult(str(directory), version)
        splits = {}
        for split, info in manifest.splits.items():
            parts = []
            for part in info.parts:
                new = done.get((split, part.name))
                if new is None:
                    columns = read_old_part(directory, split, part, manifest)
                    path = directory / split / f"{part.name}{PART_SUFFIX}"
                    new = write_part(path, layout, columns.labels, columns.dense,
                                     columns.sparse, columns.offsets)  # fmt: skip
                    del columns  # its maps
                    _note(directory, split, part.name, new)
                    result.parts_written += 1
                # the file as the loader will open it (its metadata checked)
                open_part(directory, split, new, manifest, layout)
                parts.append(new)
                result.parts += 1
                result.bytes += new.bytes
                result.rows += new.rows
                if on_part is not None:
                    on_part(new.rows)
            splits[split] = SplitInfo(info.rows, parts)
        upgraded = replace(manifest, splits=splits, schema_version=SCHEMA_VERSION)
        upgraded.upgraded_from = upgrade_record(
            upgraded,
            version,
            old_fingerprint(manifest),
            {s: old_split_fingerprint(manifest, s) for s in manifest.splits},
        )
        # The old manifest is kept until its folders are gone: a run killed after the commit
        # below removes them on its next run.
        atomic_write_bytes(_work(directory) / MANIFEST, (directory / MANIFEST).read_bytes())
        upgraded.save(directory)
        fsync_dir(directory)
        _remove_old(directory)
        logger.info(
            "%s: upgraded from schema version %d (%d parts)", directory, version, result.parts
        )
        return result
    finally:
        os.close(lock)
