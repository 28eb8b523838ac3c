"""Multi-hot ids from one-hot ids, as MLPerf DLRMv2's reference makes them.

The reference (facebookresearch/dlrm `torchrec_dlrm/multi_hot.py`) seeds numpy's global
legacy generator once, then draws one index table per sparse feature, table after table:
row r of table t is `r` followed by `size_t - 1` random ids in [0, rows_t), drawn as
`randint(0, rows, size=(rows, size - 1))` (uniform) or
`pareto(a=0.25, size=(rows, size - 1)).astype(int32) % rows` (pareto). A one-hot id x of
feature t becomes the row `x % rows_t` of its table.

Here the tables are drawn chunk by chunk straight into memory-mapped `.npy` files in a
cache directory, so a 40 M x 100 table never sits in memory. The legacy generator's
streams are chunk-invariant for these calls (randint's int64 path takes whole 32-bit draws
per value with no buffer carried between calls; pareto takes two per value), so the files
hold exactly what the reference's one big call per table holds; tests/unit/test_multihot.py
holds the two to equality. Tables are generated once per (sizes, rows, distribution, seed):
a completion marker is written last, a lock keeps ranks and workers on one host from
drawing the same tables twice, and a killed generation resumes at the first unfinished
table from the generator state saved after each one.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardrec.dataloader.format.manifest import MANIFEST, Manifest
from shardrec.dataloader.format.source import SplitSource
from shardrec.dataloader.multihot import table_files
from shardrec.dataloader.multihot.multihot_kernel import PREFETCH_AHEAD, expand_rows
from shardrec.dataloader.multihot.table_files import TABLE_DTYPE
from shardrec.dataloader.util import jit
from shardrec.dataloader.util.buffer_pool import BufferPool
from shardrec.dataloader.util.files import atomic_write_bytes

logger = logging.getLogger(__name__)

DISTRIBUTIONS = ("uniform", "pareto")
CHUNK_IDS = 1 << 22
"""Random ids drawn per call: 32 MiB of float64 for pareto, whatever the table's size."""
POOL_BYTES = 256 << 20
"""Memory of released batches' ids kept for the next ones: two runs of DLRMv2 batches of 8192
(~14 MB each), what the consumer lets go of at once (buffer_pool.py)."""
MARKER = "tables.json"
__all__ = [
    "DISTRIBUTIONS",
    "IndexTables",
    "MultiHotOption",
    "MultiHotSpec",
    "default_cache_dir",
    "already_multi_hot",
    "multihot_source",
    "multihot_spec",
    "open_index_tables",
]


@dataclass(frozen=True)
class MultiHotSpec:
    """What fixes the index tables: one multi-hot size and one row count per sparse feature."""

    sizes: tuple[int, ...]
    """Ids per sample of each feature (the reference's multi_hot_sizes); 1 keeps it one-hot."""
    rows: tuple[int, ...]
    """Rows of each feature's table (the reference's num_embeddings_per_feature)."""
    dist: str = "uniform"
    """How the extra ids are drawn: uniform or pareto."""
    seed: int = 0
    """Seed of numpy's legacy generator (the reference uses 0)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "sizes", tuple(int(s) for s in self.sizes))
        object.__setattr__(self, "rows", tuple(int(r) for r in self.rows))
        if len(self.sizes) != len(self.rows) or not self.sizes:
            raise ValueError(
                f"multi-hot sizes ({len(self.sizes)}) and table rows ({len(self.rows)}) "
                "must be non-empty lists of one value per feature"
            )
        for i, s in enumerate(self.sizes):
            if s < 1:
                raise ValueError(f"multi-hot size {s} of feature {i} must be at least 1")
        for i, r in enumerate(self.rows):
            if not 1 <= r < 2**31:
                raise ValueError(
                    f"table rows {r} of feature {i} must lie in [1, 2^31) (the tables hold int32 ids)"
                )
        if self.dist not in DISTRIBUTIONS:
            raise ValueError(
                f"multi-hot distribution {self.dist!r} must be one of {', '.join(DISTRIBUTIONS)}"
            )
        if not 0 <= self.seed < 2**32:
            raise ValueError(
                f"multi-hot seed {self.seed} must lie in [0, 2^32) (numpy's legacy seed)"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "sizes": list(self.sizes),
            "rows": list(self.rows),
            "dist": self.dist,
            "seed": self.seed,
        }

    @property
    def key(self) -> str:
        """Name of this spec's folder in a cache directory."""
        digest = hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[
            :16
        ]
        return f"{self.dist}-seed{self.seed}-{digest}"


class IndexTables:
    """The memory-mapped index tables of one spec: table t is int32 [rows_t, size_t]."""

    def __init__(self, spec: MultiHotSpec, directory: Path, tables: list[np.ndarray]) -> None:
        self.spec, self.directory, self.tables = spec, directory, tables
        # Plain ndarray views of the maps for the compiled kernel: np.memmap arguments pay
        # subclass bookkeeping on every call.
        self.plain = [t.view(np.ndarray) for t in tables]
        self._values = BufferPool(np.int64, POOL_BYTES)
        self._lengths: dict[int, np.ndarray] = {}

    def expand(
        self,
        t: int,
        ids: np.ndarray,
        compiled: bool = jit.AVAILABLE,
        dtype: np.dtype | type = TABLE_DTYPE,
    ) -> np.ndarray:
        """Multi-hot ids [len(ids), size_t] of feature t's one-hot ids (folded into its rows), in
        `dtype` (a dataset column's, cast as they are written: table ids are never negative);
        `compiled`: by multihot_kernel (one pass, prefetched, no GIL held), else numpy."""
        rows = self.spec.rows[t]
        ids = np.asarray(ids)
        if compiled:
            out = np.empty((len(ids), self.spec.sizes[t]), dtype)
            expand_rows(self.plain[t], ids, out.reshape(-1), PREFETCH_AHEAD)
            return out
        if ids.size and (int(ids.max()) >= rows or int(ids.min()) < 0):
            ids = np.remainder(ids, rows)  # the reference folds ids with `% rows` before its lookup
        return np.take(self.tables[t], ids, axis=0).astype(dtype, copy=False)

    def expand_batch(
        self, ids: np.ndarray, compiled: bool = jit.AVAILABLE
    ) -> tuple[np.ndarray, np.ndarray]:
        """Multi-hot values and lengths of one batch's one-hot ids [features, b], feature-major
        as a materialised dataset's. The values' memory is recycled from batches nobody holds
        any more (buffer_pool.py); the lengths, the same for every batch of b, are shared."""
        sizes, b = self.spec.sizes, ids.shape[1]
        out = self._values.take(sum(sizes) * b)
        at = 0
        for f, size in enumerate(sizes):
            if compiled:  # straight into place, with prefetches: the rows miss every cache
                expand_rows(self.plain[f], ids[f], out[at : at + size * b], PREFETCH_AHEAD)
            else:
                out[at : at + size * b] = self.expand(f, ids[f], compiled=False).reshape(-1)
            at += size * b
        if (lengths := self._lengths.get(b)) is None:
            lengths = self._lengths[b] = np.repeat(np.asarray(sizes, np.int32), b)
        return out, lengths


def multihot_spec(
    manifest: Manifest,
    sizes: list[int],
    rows: list[int] | None = None,
    dist: str = "uniform",
    seed: int = 0,
) -> MultiHotSpec:
    """The spec that turns a one-hot dataset's features into multi-hot ones, in manifest order.

    Args:
        sizes: ids per sample of each sparse feature.
        rows: table rows per feature (default: each feature's cardinality, as the reference
            takes num_embeddings_per_feature).
    """
    names = manifest.feature_names
    if len(sizes) != len(names):
        raise ValueError(
            f"{len(sizes)} multi-hot sizes for {len(names)} sparse features ({', '.join(names)}): give one per feature"
        )
    if rows is not None and len(rows) != len(names):
        raise ValueError(
            f"{len(rows)} table rows for {len(names)} sparse features ({', '.join(names)}): give one per feature"
        )
    for feat in manifest.sparse_features:
        if feat.multi_hot:
            raise ValueError(
                f"feature {feat.name} is already multi-hot: multi-hot ids are made from one-hot ones"
            )
        if feat.raw:  # 64-bit keys, not rows: `% rows` would fold them into ids of no meaning
            raise ValueError(
                f"feature {feat.name} holds raw ids (preprocessed with --raw-ids), not table rows: "
                "multi-hot ids are made from one-hot rows; preprocess it without --raw-ids"
            )
    given = rows is not None
    rows = list(rows) if given else [f.cardinality for f in manifest.sparse_features]
    _check_rows(names, rows, "" if given else " (its cardinality)")
    return MultiHotSpec(tuple(sizes), tuple(rows), dist, seed)


def _check_rows(names: list[str], rows: list[int], whence: str) -> None:
    """ValueError naming the first feature whose table rows int32 ids cannot index (MultiHotSpec
    would say only the feature's index)."""
    for name, r in zip(names, rows):
        if not 1 <= r < 2**31:
            raise ValueError(
                f"feature {name}: {r:,} table rows{whence}, but multi-hot index tables hold int32 "
                "ids: give it from 1 to 2^31 - 1 (`data multihot --rows`, data.multihot_rows in "
                "training)"
            )


def already_multi_hot(manifest: Manifest, directory: Path) -> tuple[str, str | None] | None:
    """Why the dataset at `directory` cannot be made multi-hot, naming its first multi-hot
    feature and what made it so, and the one-hot dataset a `data multihot` copy was made from
    (None if unrecorded); None if every feature is one-hot."""
    feat = next((f for f in manifest.sparse_features if f.multi_hot), None)
    if feat is None:
        return None
    source = (manifest.options.get("multihot") or {}).get("source")
    made = (
        f"`shardrec data multihot` copy of {source}"
        if source
        else "list column of its feature spec"
        if "spec" in manifest.options
        else "multi-hot column"
    )
    return f"{directory}: feature {feat.name} is already multi-hot (a {made})", source


def default_cache_dir() -> Path:
    """Where index tables live unless told: $XDG_CACHE_HOME/shardrec/multihot (~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "shardrec" / "multihot"


def _open_complete(directory: Path, spec: MultiHotSpec) -> IndexTables | None:
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if marker.get("spec") != spec.to_dict():
        return None
    tables = [
        table_files.open_table(table_files.table_path(directory, t), r, s)
        for t, (r, s) in enumerate(zip(spec.rows, spec.sizes))
    ]
    if any(t is None for t in tables):
        return None
    return IndexTables(spec, directory, tables)  # type: ignore[arg-type]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock held while tables are drawn: other ranks wait, then reuse them."""
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def open_index_tables(
    cache_dir: str | Path,
    spec: MultiHotSpec,
    *,
    chunk_ids: int = CHUNK_IDS,
    on_table: Callable[[int, int], None] | None = None,
) -> IndexTables:
    """The index tables of `spec`, drawn into `cache_dir` on first use and memory-mapped.

    Args:
        cache_dir: folder shared by everyone who needs these tables; each spec gets its own
            sub-folder, so specs do not overwrite each other.
        chunk_ids: random ids drawn per generator call (memory is ~8 bytes per id).
        on_table: called with (table index, rows) after each table is drawn (progress).
    """
    if chunk_ids < 1:
        raise ValueError(f"chunk_ids must be positive, got {chunk_ids}")
    directory = Path(cache_dir) / spec.key
    if (tables := _open_complete(directory, spec)) is not None:
        return tables
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(
            f"{directory}: cannot create the multi-hot table cache: {e.strerror or e}"
        ) from None
    with _locked(directory.parent / f".{spec.key}.lock"):
        if (tables := _open_complete(directory, spec)) is not None:
            return tables  # another process drew them while this one waited
        for stale in directory.glob(".table-*.tmp-*"):  # left by a generation that was killed
            stale.unlink(missing_ok=True)
        first, rng = table_files.resume_point(directory, spec)
        if first:
            logger.info(
                "%s: resuming multi-hot tables at table %d of %d", directory, first, len(spec.sizes)
            )
        for t in range(first, len(spec.sizes)):
            table_files.write_table(
                table_files.table_path(directory, t),
                rng,
                spec.rows[t],
                spec.sizes[t],
                spec.dist,
                chunk_ids,
            )
            table_files.save_progress(directory, spec, t + 1, rng)
            if on_table is not None:
                on_table(t, spec.rows[t])
        files = {p.name: p.stat().st_size for p in sorted(directory.glob("table-*.npy"))}
        atomic_write_bytes(
            directory / MARKER,
            json.dumps({"spec": spec.to_dict(), "files": files}, indent=1).encode(),
        )
    tables = _open_complete(directory, spec)
    assert tables is not None, f"{directory}: tables unreadable right after they were written"
    return tables


@dataclass(frozen=True)
class MultiHotOption:
    """Multi-hot ids made at batch time from a one-hot dataset (build_loader's `multihot`):
    the same batches as reading the dataset `shardrec data multihot` materialises."""

    sizes: tuple[int, ...]
    """Ids per sample of each sparse feature, in the dataset's feature order."""
    rows: tuple[int, ...] | None = None
    """Table rows per feature (None: the manifest's cardinalities, or the torchrec layout's
    hashes)."""
    dist: str = "uniform"
    """uniform or pareto."""
    seed: int = 0
    """Seed of numpy's legacy generator."""
    cache_dir: str | Path | None = None
    """Where the index tables are drawn once and shared (None: default_cache_dir())."""


def multihot_source(source: SplitSource, option: MultiHotOption) -> tuple[SplitSource, IndexTables]:
    """The index tables for a one-hot split, and the split with a fingerprint that names them
    (a loader state saved without multi-hot ids, or with other tables, is refused on resume)."""
    rows = list(option.rows) if option.rows is not None else None
    if (source.directory / MANIFEST).is_file():
        spec = multihot_spec(
            Manifest.load(source.directory), list(option.sizes), rows, option.dist, option.seed
        )
    else:
        if rows is None:
            missing = [n for n in source.feature_names if n not in source.modulo]
            if missing:
                raise ValueError(
                    f"{source.directory}: no cardinality known for {', '.join(missing)}: give the multi-hot table rows"
                )
            rows = [source.modulo[n] for n in source.feature_names]
            _check_rows(source.feature_names, rows, " (its hash in the torchrec layout)")
        if len(option.sizes) != len(source.feature_names):
            raise ValueError(
                f"{len(option.sizes)} multi-hot sizes for {len(source.feature_names)} sparse features: "
                "give one per feature"
            )
        spec = MultiHotSpec(tuple(option.sizes), tuple(rows), option.dist, option.seed)
    tables = open_index_tables(
        option.cache_dir if option.cache_dir is not None else default_cache_dir(), spec
    )
    fingerprint = hashlib.sha256(f"{source.fingerprint};multihot:{spec.key}".encode()).hexdigest()
    return dataclasses.replace(source, fingerprint=fingerprint), tables
