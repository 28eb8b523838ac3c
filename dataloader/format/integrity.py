"""Integrity checks of a dataset beyond what opening it costs: `data verify` and the message for
an out-of-range id that the loader shares.

Opening a part (part_file.open_part) checks only what is cheap: its size and metadata. `verify`
reads everything: every file's SHA-256 against the manifest, then every id against its table's
rows and every list's offsets, since a checksum proves the bytes are the recorded ones, not that
they make a valid part.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from shardrec.dataloader.format.dataset_files import file_sha256, inside_dataset
from shardrec.dataloader.format.manifest import (
    MANIFEST,
    PART_SUFFIX,
    DatasetError,
    Manifest,
    PartInfo,
)
from shardrec.dataloader.format.part_file import (
    ChangedFileError,
    Part,
    manifest_layout,
    open_part,
)


def id_out_of_range(part: Part, feature: str, row: int, value: int) -> str:
    """The message for an id at or beyond its table's rows (loader and `data verify` alike)."""
    return (
        f"{part.path}: column {feature}, row {row} has id {value}, "
        f"outside table {feature} of {part.limits[feature]} rows "
        f"(the file disagrees with its manifest: rebuild it with `shardrec preprocess`)"
    )


def check_list_rows(
    part: Part, feature: str, rows: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> None:
    """DatasetError naming the first of `rows` (local) whose offsets in `part` (starts, ends) do not
    lie in order within the feature's ids: opening checks the offsets' ends only, and a middle one
    gone negative or past the ids was read silently (numpy's take wraps a negative index) or as a
    raw numpy error."""
    size = len(part.sparse[feature])
    if not len(rows) or (starts.min() >= 0 and (ends - starts).min() >= 0 and ends.max() <= size):
        return
    bad = int(np.argmax((starts < 0) | (ends < starts) | (ends > size)))
    raise DatasetError(
        f"{part.path}: column {feature}, row {int(rows[bad])} has offsets {int(starts[bad])} to "
        f"{int(ends[bad])}, not in order within its {size:,} ids (the file disagrees with its "
        "manifest: rebuild it with `shardrec preprocess`)"
    )


def label_not_binary(part: Part, row: int, value: float) -> str:
    """The message for a label other than 0 and 1 (loader, `data head` and `data verify`)."""
    return (
        f"{part.path}: column label, row {row} has label {value}, not 0 or 1 "
        f"(the file disagrees with its manifest: rebuild it with `shardrec preprocess`)"
    )


def check_labels(part: Part, chunk: int = 1 << 24) -> list[str]:
    """Read every label of the part: a message for the first that is not 0 or 1."""
    for a in range(0, part.rows, chunk):
        block = np.asarray(part.labels[a : a + chunk])
        if len(block) and int(block.max()) > 1:
            k = int(np.argmax(block > 1))
            return [label_not_binary(part, a + k, int(block[k]))]
    return []


def one_label(parts: Iterable[Part], chunk: int = 1 << 24) -> int | None:
    """The label every row of `parts` has, or None where both 0 and 1 occur (or there are no
    rows). Reads until it has seen both: a split of both classes costs its first labels (and,
    given a generator, opens only the parts it reads)."""
    seen = set()
    for part in parts:
        for a in range(0, part.rows, chunk):
            block = np.asarray(part.labels[a : a + chunk])
            if len(block):
                seen.update({int(block.min()), int(block.max())})
            if len(seen) > 1:
                return None
    return seen.pop() if seen else None


def bad_label_error(parts: list[Part], part_starts: np.ndarray, rows: np.ndarray) -> DatasetError:
    """The loader's error for a batch of global rows `rows` one of whose labels is not 0 or 1:
    the first such row, by file and row. Only called once the check has failed, so it may be
    slow."""
    for r in rows.tolist():
        p = int(np.searchsorted(part_starts, r, side="right")) - 1
        local = r - int(part_starts[p])
        value = parts[p].labels[local].item()  # as stored: a torchrec npy day's may be floats
        if value not in (0, 1):
            return DatasetError(label_not_binary(parts[p], local, value))
    raise AssertionError("bad_label_error called for rows whose labels are all 0 or 1")


def check_ids(part: Part, chunk: int = 1 << 22) -> list[str]:
    """Read every id of the part: one message per feature with an id outside its table."""
    problems = []
    for name, limit in part.limits.items():
        if not limit:  # raw ids (format.raw_ids): any 64-bit value is an id
            continue
        ids = part.sparse[name]
        for a in range(0, len(ids), chunk):
            block = np.asarray(ids[a : a + chunk])
            if len(block) and int(block.max()) >= limit:
                k = a + int(np.argmax(block >= limit))
                row = (
                    k
                    if name not in part.offsets
                    else int(np.searchsorted(part.offsets[name], k, side="right")) - 1
                )
                problems.append(id_out_of_range(part, name, row, int(ids[k])))
                break
    return problems


def check_offsets(part: Part) -> list[str]:
    """Every list's offsets never decrease (opening checked their ends): one message per list."""
    problems = []
    for name, off in part.offsets.items():
        steps = np.diff(np.asarray(off))
        if len(steps) and int(steps.min()) < 0:
            row = int(np.argmax(steps < 0))
            problems.append(
                f"{part.path}: column {name}: offsets decrease at row {row} "
                f"({int(off[row])} then {int(off[row + 1])})"
            )
    return problems


def _file_problem(directory: Path, path: Path, info: PartInfo) -> str | None:
    if not path.is_file():
        return f"{path}: missing"
    try:
        inside_dataset(directory, path)
    except DatasetError as e:
        return str(e)
    if path.stat().st_size != info.bytes:
        return f"{path}: {path.stat().st_size} bytes, manifest says {info.bytes}"
    if file_sha256(path) != info.sha256:
        return f"{path}: checksum differs from the manifest"
    return None


def changed_since_written(directory: str | Path) -> list[str]:
    """Part files missing, of another size than the manifest says, or modified after it was written
    (another job rewriting the dataset): found with stat alone, so a failed run can name its
    cause."""
    directory = Path(directory)
    try:
        manifest, written = Manifest.load(directory), (directory / MANIFEST).stat().st_mtime
    except (DatasetError, OSError):
        return []
    problems = []
    for split, info in manifest.splits.items():
        for part in info.parts:
            path = directory / split / part.name
            try:
                found = path.stat()
            except OSError:
                problems.append(f"{path}: missing")
                continue
            if found.st_size != part.bytes:
                problems.append(f"{path}: {found.st_size} bytes, manifest says {part.bytes}")
            elif found.st_mtime > written:
                problems.append(f"{path}: modified after the manifest was written")
    return problems


def verify(directory: str | Path) -> list[str]:
    """Check every part against the manifest: its file's size and SHA-256; then, as the loader
    would open it, its metadata, every id below its table's rows and every list's offsets in order
    (a checksum proves the bytes are the ones recorded, not that they make a valid part).
    Returns one message per problem."""
    directory = Path(directory)
    manifest = Manifest.load(directory)
    layout = manifest_layout(manifest, directory)
    problems = []
    for split, info in manifest.splits.items():
        for part in info.parts:
            found = _file_problem(directory, directory / split / part.name, part)
            if found:
                problems.append(found)
                continue
            try:
                opened = open_part(directory, split, part, manifest, layout)
            except ChangedFileError as e:  # without its advice: verify's report gives its own
                problems.append(e.problem)
                continue
            except DatasetError as e:
                problems.append(str(e))
                continue
            problems += check_labels(opened) + check_ids(opened) + check_offsets(opened)
    return problems + unlisted_parts(directory, manifest)


def unlisted_parts(directory: Path, manifest: Manifest) -> list[str]:
    """A part file in a split's folder that the manifest does not list: no command reads its rows
    (a part copied in by hand, or left by another run), so the dataset is not what the folder
    shows."""
    out = []
    for split, info in manifest.splits.items():
        listed = {p.name for p in info.parts}
        for path in sorted((directory / split).glob(f"*{PART_SUFFIX}")):
            if path.name not in listed:
                out.append(
                    f"{path}: not in the manifest, so no command reads its rows; remove it, or "
                    "re-run the preprocessing that should have written it"
                )
    return out


def bad_id_error(
    parts: list[Part], part_starts: np.ndarray, feature: str, values: np.ndarray, rows: np.ndarray
) -> DatasetError:
    """The loader's error for a batch whose ids of `feature` (values[k] read from global row
    rows[k]) hold one outside the table: the first such row, by file and row. Only called once
    a bounds check has failed, so it may be slow."""
    limit = parts[0].limits[feature]
    k = int(np.argmax(np.asarray(values).reshape(-1).view(np.uint64) >= limit))
    p = int(np.searchsorted(part_starts, rows[k], side="right")) - 1
    local = int(rows[k] - part_starts[p])
    return DatasetError(
        id_out_of_range(parts[p], feature, local, int(parts[p].sparse[feature][local]))
    )


def bad_jagged_id_error(
    parts: list[Part], groups: list[tuple[int, np.ndarray]], feature: str
) -> DatasetError:
    """`bad_id_error` for a multi-hot feature: groups are (part, local rows) pairs that were
    read."""
    limit = parts[0].limits[feature]
    for p, local in groups:
        ids, off = parts[p].sparse[feature], parts[p].offsets[feature]
        for r in local:
            row_ids = np.asarray(ids[off[r] : off[r + 1]])
            if len(row_ids) and int(row_ids.max()) >= limit:
                return DatasetError(
                    id_out_of_range(
                        parts[p], feature, int(r), int(row_ids[np.argmax(row_ids >= limit)])
                    )
                )
    raise AssertionError(f"no id of {feature} outside its {limit} rows among the rows read")
