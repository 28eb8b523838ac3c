"""Materialise a multi-hot dataset from a one-hot one (`shardrec data multihot`).

Each one-hot id becomes its row of the feature's index table
(dataloader/multihot/multihot_tables.py, the MLPerf DLRMv2 reference's tables); labels and dense
values are copied byte for byte (the source part's checksum checked first). A feature of size 1
stays one-hot. A part's file is written column by column, each multi-hot column chunk by chunk
as it is expanded, and hashed as it is written (arrow_ipc_write's streamed buffers), so memory stays
a few chunks whatever the part size; the whole dataset is built in a temporary folder beside the
output and renamed into place at the end, so a reader never sees half a dataset.

Parts are converted in parallel on `workers` threads, not processes: the work is numpy's take
from the memory-mapped tables, the cast to the column's dtype, SHA-256 and file writes, which
all release the GIL on blocks this size, and threads share the tables' maps and page cache.
Each part is written on its own, so the bytes do not depend on the worker count.

A part's file is synced to disk on other threads while the workers convert the next parts,
and all of them before the manifest is written and the dataset renamed into place. Synced
inline, a worker waited for the disk after every column: on a slow disk more of its time went to
fsync than to the conversion itself.

The planner's statistics are counted by the workers on the way (multihot_stats.py), not read
back from the written columns after the last part.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from shardrec.dataloader.format.arrow_ipc import FileLayout
from shardrec.dataloader.format.arrow_ipc_write import Streamed
from shardrec.dataloader.format.dataset_files import file_sha256
from shardrec.dataloader.format.manifest import (
    DatasetError,
    Manifest,
    PartInfo,
    SplitInfo,
    smallest_uint,
)
from shardrec.dataloader.format.part_file import file_layout, open_part, write_part
from shardrec.dataloader.multihot.multihot_tables import (
    IndexTables,
    default_cache_dir,
    multihot_spec,
    open_index_tables,
)
from shardrec.dataloader.util.files import fsync_dir, fsync_path
from shardrec.tools.preprocess.derived.multihot_stats import OneHotCounts
from shardrec.tools.preprocess.parts.feature_stats import compute_feature_stats

CHUNK_ROWS = 1 << 16
"""Rows converted per step (a 100-hot feature: 6.5 M ids, ~50 MB)."""


def _expanded(
    ids: np.ndarray, tables: IndexTables, t: int, dtype: np.dtype, chunk_rows: int
) -> Streamed:
    """Feature t's multi-hot ids of the one-hot `ids`, made chunk by chunk as they are written."""

    def chunks():
        for a in range(0, len(ids), chunk_rows):
            # in the column's dtype: no cast pass on the way out
            yield tables.expand(t, ids[a : a + chunk_rows], dtype=dtype).reshape(-1)

    return Streamed(np.dtype(dtype), len(ids) * tables.spec.sizes[t], chunks)


def _offsets(rows: int, size: int, chunk_rows: int) -> Streamed:
    """Row offsets of a list of `size` ids in every row, made chunk by chunk."""

    def chunks():
        yield np.zeros(1, np.int64)
        for a in range(0, rows, chunk_rows):
            yield np.arange(a + 1, min(rows, a + chunk_rows) + 1, dtype=np.int64) * size

    return Streamed(np.dtype(np.int64), rows + 1, chunks)


def _convert_part(
    src: Path,
    out: Path,
    split: str,
    info: PartInfo,
    manifest: Manifest,
    layout: FileLayout,
    tables: IndexTables,
    chunk_rows: int,
    counts: OneHotCounts | None,
) -> PartInfo:
    part = open_part(src, split, info, manifest)
    # Labels and dense values are copied as they are: the source file must be the one its
    # manifest records (the ids are bounds-checked as they are expanded).
    if file_sha256(part.path) != info.sha256:
        raise DatasetError(
            f"{part.path}: checksum differs from its manifest (corrupted?); check with `shardrec data verify`"
        )
    sparse, offsets = {}, {}
    for t, feat in enumerate(manifest.sparse_features):
        ids, size = part.sparse[feat.name], tables.spec.sizes[t]
        dtype = smallest_uint(tables.spec.rows[t] - 1)
        sparse[feat.name] = _expanded(ids, tables, t, dtype, chunk_rows)
        if size > 1:
            offsets[feat.name] = _offsets(len(ids), size, chunk_rows)
    done = write_part(
        out / split / info.name, layout, part.labels, part.dense, sparse, offsets, fsync=False
    )
    if counts is not None and split == "train":
        for t, feat in enumerate(manifest.sparse_features):
            counts.add(t, part.sparse[feat.name])  # one more pass over 1 id a sample
    return done


def _sync_part(path: Path) -> None:
    """A converted part's file and its directory entry, on disk."""
    fsync_path(path)
    fsync_dir(path.parent)


def _feature_stats(
    directory: Path, manifest: Manifest, counts: OneHotCounts | None, workers: int
) -> dict[str, dict[str, float]]:
    """Training-split statistics: from the workers' counts, and read back from the written
    columns for the features too large to count exactly (feature_stats.py samples those)."""
    if counts is None:
        return {}
    stats = counts.feature_stats(manifest.splits["train"].rows)
    rest = [f for t, f in enumerate(manifest.sparse_features) if t not in counts.counted]
    if rest:
        stats.update(compute_feature_stats(directory, manifest, "train", workers, rest))
    return stats


def check_out(src: Path, out: Path) -> None:
    """Refuse an output that is not new (or empty), or that lies inside the source."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out}: exists and is not an empty directory; choose a new --out")
    if out.resolve() == src.resolve() or src.resolve() in out.resolve().parents:
        raise ValueError(f"{out}: inside the source dataset {src}; choose a folder outside it")


def prepare_multihot(
    src: str | Path,
    sizes: list[int],
    *,
    rows: list[int] | None = None,
    dist: str = "uniform",
    seed: int = 0,
    cache_dir: str | Path | None = None,
) -> IndexTables:
    """The index tables of a materialisation of `src` (drawn on first use), with the compiled
    kernels it runs loaded for this dataset's id types: the one-time work that a timed
    materialisation given these tables does not count."""
    manifest = Manifest.load(src)
    spec = multihot_spec(manifest, sizes, rows, dist, seed)
    tables = open_index_tables(cache_dir if cache_dir is not None else default_cache_dir(), spec)
    for t, feat in enumerate(
        manifest.sparse_features
    ):  # one signature per (id dtype, column dtype)
        tables.expand(t, np.zeros(1, feat.dtype), dtype=smallest_uint(spec.rows[t] - 1))
    OneHotCounts(manifest, tables).warm()
    return tables


def _remove_killed_runs_copies(out: Path) -> None:
    """Remove the temporary folders of runs into `out` killed before their rename (SIGKILL, the
    OOM killer): each holds up to a whole copy (Criteo 1TB's is ~4 TB) under a dot-name with its
    pid, which no rerun (another pid) would reuse or see. A folder whose process still runs on
    this machine is left alone."""
    for stale in out.parent.glob(f".{glob.escape(out.name)}.tmp-*"):
        pid = stale.name.rpartition("-")[2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def materialize_multihot(
    src: str | Path,
    out: str | Path,
    sizes: list[int],
    *,
    rows: list[int] | None = None,
    dist: str = "uniform",
    seed: int = 0,
    cache_dir: str | Path | None = None,
    chunk_rows: int = CHUNK_ROWS,
    on_rows: Callable[[int], None] | None = None,
    workers: int = 1,
    tables: IndexTables | None = None,
) -> Manifest:
    """Write a copy of the one-hot dataset `src` at `out` whose sparse features are multi-hot.

    Args:
        sizes, rows, dist, seed: the index tables (dataloader.multihot.multihot_spec).
        cache_dir: where the index tables are drawn once (default: default_cache_dir()).
        on_rows: called with the rows of each part once it is written (progress), in part order.
        workers: parts converted at once, on threads (the output is the same for any count).
        tables: the spec's tables from prepare_multihot (default: opened here, drawn on first use).

    Returns:
        The new dataset's manifest: per-feature cardinality = table rows, multi_hot for
        sizes above 1, statistics recomputed; options["multihot"] records the spec.
    """
    src, out = Path(src), Path(out)
    manifest = Manifest.load(src)
    spec = multihot_spec(manifest, sizes, rows, dist, seed)
    if chunk_rows < 1 or workers < 1:
        raise ValueError(f"chunk_rows and workers must be positive, got {chunk_rows} and {workers}")
    check_out(src, out)
    if tables is None:
        tables = open_index_tables(
            cache_dir if cache_dir is not None else default_cache_dir(), spec
        )
    elif tables.spec != spec:
        raise ValueError(f"index tables of {tables.spec} given for a materialisation of {spec}")
    counts = OneHotCounts(manifest, tables) if "train" in manifest.splits else None
    _remove_killed_runs_copies(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        splits = {split: SplitInfo(rows=info.rows) for split, info in manifest.splits.items()}
        jobs = [(split, part) for split, info in manifest.splits.items() for part in info.parts]
        for split in splits:
            (tmp / split).mkdir(parents=True)

        # Each feature keeps the rest of what its manifest says (a spec's `table` shared with
        # another column), as on-the-fly ids do (trainer.job.data_options.model_manifest).
        features = [
            dataclasses.replace(
                f, cardinality=r, dtype=str(smallest_uint(r - 1)), multi_hot=k > 1, stats={}
            )
            for f, k, r in zip(manifest.sparse_features, spec.sizes, spec.rows)
        ]
        layout = file_layout(manifest.dense_features, manifest.dense_dtype, features)

        def convert(job: tuple[str, PartInfo]) -> PartInfo:
            return _convert_part(
                src, tmp, job[0], job[1], manifest, layout, tables, chunk_rows, counts
            )

        pool = ThreadPoolExecutor(workers, thread_name_prefix="shardrec-multihot")
        syncer = ThreadPoolExecutor(workers, thread_name_prefix="shardrec-multihot-sync")
        synced: list[Future] = []
        try:
            # map yields in part order; an error ends the run (the temporary folder is removed
            # below).
            for (split, _), done in zip(jobs, pool.map(convert, jobs)):
                splits[split].parts.append(done)
                synced.append(syncer.submit(_sync_part, tmp / split / done.name))
                if on_rows is not None:
                    on_rows(done.rows)
            for f in synced:
                f.result()  # every part on disk before the manifest names it
        finally:
            pool.shutdown(
                wait=True, cancel_futures=True
            )  # parts not started are dropped on an error
            syncer.shutdown(wait=True, cancel_futures=True)
        options = {**manifest.options, "multihot": {**spec.to_dict(), "source": str(src)}}
        result = dataclasses.replace(
            manifest, sparse_features=features, splits=splits, options=options, upgraded_from={}
        )
        stats = _feature_stats(tmp, result, counts, workers)
        for f in features:
            f.stats = stats.get(f.name, {})
        result.save(tmp)
        if out.is_dir():
            out.rmdir()  # empty (checked above): the rename needs the name free
        os.replace(tmp, out)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result
