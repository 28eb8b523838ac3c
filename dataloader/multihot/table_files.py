"""An index table's file (multihot_tables.py): drawn block by block on the reference's generator
calls, written through a temporary name, opened memory-mapped; and the progress record (the
generator's state after each finished table) from which a killed generation resumes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from shardrec.dataloader.util.files import atomic_path, atomic_write_bytes

PARETO_A = 0.25
"""The reference's pareto shape: a very heavy tail, so a few ids take most lookups."""
TABLE_DTYPE = np.dtype(np.int32)
"""The reference keeps its tables as int32 tensors."""
PROGRESS = "progress.json"


class TablesSpec(Protocol):
    """What this module reads of a multihot_tables.MultiHotSpec (which imports this module)."""

    seed: int
    rows: tuple[int, ...]
    sizes: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]: ...


def table_path(directory: Path, t: int) -> Path:
    return directory / f"table-{t:03d}.npy"


def draw(rng: np.random.RandomState, dist: str, rows: int, shape: tuple[int, int]) -> np.ndarray:
    """The reference's draw of one block of extra ids, on the same generator calls."""
    if dist == "uniform":
        return rng.randint(0, rows, size=shape)
    # Draws above 2^31 overflow the int32 cast exactly as they do in the reference; numpy warns.
    with np.errstate(invalid="ignore"):
        return rng.pareto(a=PARETO_A, size=shape).astype(np.int32) % rows


def write_table(
    path: Path, rng: np.random.RandomState, rows: int, size: int, dist: str, chunk_ids: int
) -> None:
    # Written block by block through a plain file, not a writable memory map: the process then
    # holds one block, not every page of a 16 GB table until the kernel writes it back.
    header = {
        "descr": np.lib.format.dtype_to_descr(TABLE_DTYPE),
        "fortran_order": False,
        "shape": (rows, size),
    }
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        if size == 1:
            draw(
                rng, dist, rows, (rows, 0)
            )  # the reference's empty draw: takes nothing, kept faithful
        step = max(1, chunk_ids // max(size - 1, 1))
        for a in range(0, rows, step):
            b = min(rows, a + step)
            block = np.empty((b - a, size), TABLE_DTYPE)
            block[:, 0] = np.arange(a, b)
            if size > 1:
                block[:, 1:] = draw(rng, dist, rows, (b - a, size - 1))
            f.write(block.data)


def open_table(path: Path, rows: int, size: int) -> np.ndarray | None:
    """The table at `path` memory-mapped, or None if it is missing or not of this shape."""
    try:
        table = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return None
    return table if table.shape == (rows, size) and table.dtype == TABLE_DTYPE else None


def resume_point(directory: Path, spec: TablesSpec) -> tuple[int, np.random.RandomState]:
    """First table still to draw and the generator positioned for it (0 and a fresh seed if
    there is no usable progress record)."""
    rng = np.random.RandomState(spec.seed)
    try:
        progress = json.loads((directory / PROGRESS).read_text())
    except (OSError, json.JSONDecodeError):
        return 0, rng
    done = int(progress.get("tables", 0)) if progress.get("spec") == spec.to_dict() else 0
    if done and all(
        open_table(table_path(directory, t), spec.rows[t], spec.sizes[t]) is not None
        for t in range(done)
    ):
        name, keys, pos, has_gauss, gauss = progress["rng"]
        rng.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
        return done, rng
    return 0, rng


def save_progress(directory: Path, spec: TablesSpec, done: int, rng: np.random.RandomState) -> None:
    name, keys, pos, has_gauss, gauss = rng.get_state()
    record = {
        "spec": spec.to_dict(),
        "tables": done,
        "rng": [name, keys.tolist(), int(pos), int(has_gauss), float(gauss)],
    }
    atomic_write_bytes(directory / PROGRESS, json.dumps(record).encode())
