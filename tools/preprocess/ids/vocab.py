"""Vocabulary mode in bounded memory: sorted count runs on disk, an external merge, mapped
vocabularies.

1. Counting (vocab_count.count_task, one per task that holds training lines): per-feature
   (value, count) pairs of the training rows, sorted by value, spilled to a *run* on disk
   (`.work/count-NNNNN/run-RRR/{name}.values.npy`, `.counts.npy`) whenever the pairs held reach
   the budget; `count-NNNNN.json` is written last.
2. Merging (build_vocabularies, once): per feature, every run is memory-mapped and merged in
   value ranges, each holding at most the budget's worth of pairs; values seen at least
   min_count times are appended to `.work/vocab/{name}.values.npy` with their counts beside them,
   and a histogram of counts is kept (few distinct counts). A second streaming pass gives each
   kept value its id: ids 2, 3, ... by decreasing count, ties by value (ids.Vocabulary.build's
   order, without sorting the whole vocabulary: the id of a value with count c is 2 + the number
   of kept values with a larger count + those with count c and a smaller value).
3. Mapping: each worker memory-maps `{name}.values.npy` and `{name}.ids.npy` (the page cache is
   shared between workers, nothing is loaded whole).

What the budget bounds (`--vocab-memory-mb`, per process): the (value, count) pairs a counting
worker holds before it spills a run, and the pairs the merge holds for one value range, at
ENTRY_BYTES per pair (the pairs, their concatenation, the sort order and the sums). Not counted:
the parser's own arrays (tens of MB per worker), and pages of mapped files, which the kernel
drops under pressure.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
from pathlib import Path

import numpy as np

from shardrec.dataloader.util.files import (
    atomic_open,
    atomic_path,
    atomic_write_bytes,
    fsync_dir,
    fsync_path,
)
from shardrec.tools.preprocess.ids.id_maps import Vocabulary, merge_counts

ENTRY_BYTES = 64
DEFAULT_MEMORY_MB = 256
_NPY_HEADER = 128  # a fixed .npy header, so arrays of unknown length can be streamed after it


def budget_entries(memory_bytes: int) -> int:
    """(value, count) pairs that fit in `memory_bytes` of working memory."""
    return max(int(memory_bytes) // ENTRY_BYTES, 16)


def _npy_header(dtype: np.dtype, n: int) -> bytes:
    d = repr(
        {
            "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
            "fortran_order": False,
            "shape": (n,),
        }
    )
    body = d.encode("latin1").ljust(_NPY_HEADER - 10 - 1) + b"\n"
    return b"\x93NUMPY\x01\x00" + (len(body)).to_bytes(2, "little") + body


class _Appender:
    """A 1-D .npy written in pieces of known dtype and unknown total length (header fixed last)."""

    def __init__(self, path: Path, dtype: np.dtype) -> None:
        self.path, self.dtype, self.n = path, np.dtype(dtype), 0
        self._ctx = atomic_path(path, sync_dir=False)  # build_vocabularies syncs the folder once
        self.f = open(self._ctx.__enter__(), "wb")
        self.f.write(b"\0" * _NPY_HEADER)

    def append(self, a: np.ndarray) -> None:
        self.f.write(np.ascontiguousarray(a, dtype=self.dtype).tobytes())
        self.n += len(a)

    def close(self) -> None:
        self.f.seek(0)
        self.f.write(_npy_header(self.dtype, self.n))
        self.f.close()
        self._ctx.__exit__(
            None, None, None
        )  # fsync, then rename into place (the folder: later, once)


def count_marker(work: Path, index: int) -> Path:
    return work / f"count-{index:05d}.json"


class CountRuns:
    """One counting task's sorted (value, count) runs, spilled to disk as the budget fills."""

    def __init__(self, work: Path, index: int, names: list[str], memory_bytes: int) -> None:
        self.dir, self.names, self.limit = (
            work / f"count-{index:05d}",
            names,
            budget_entries(memory_bytes),
        )
        self.index, self.work = index, work
        self.pieces: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in names]
        self.held, self.runs, self.entries = 0, 0, 0

    def add(self, f: int, values: np.ndarray, counts: np.ndarray) -> None:
        self.pieces[f].append((values, counts))
        self.held += len(values)

    def maybe_spill(self) -> None:
        if self.held >= self.limit:
            self._spill()

    def _spill(self) -> None:
        run = self.dir / f"run-{self.runs:03d}"
        run.mkdir(parents=True, exist_ok=True)
        for f, name in enumerate(self.names):
            values, counts = merge_counts(self.pieces[f])
            self.pieces[f] = []
            for suffix, a in ((".values.npy", values), (".counts.npy", counts)):
                with atomic_open(run / f"{name}{suffix}", sync_dir=False) as fh:
                    np.save(fh, a)
            self.entries += len(values)
        fsync_dir(run)  # once, after every file's rename in it; the marker comes after (finish)
        self.runs, self.held = self.runs + 1, 0

    def finish(self) -> Path:
        """Spill what is held; then the marker (a rerun trusts a task whose marker exists)."""
        if self.held or not self.runs:
            self._spill()
        fsync_path(self.dir)
        marker = count_marker(self.work, self.index)
        atomic_write_bytes(
            marker, json.dumps({"runs": self.runs, "entries": self.entries}).encode()
        )
        return marker


def run_dirs(work: Path, indices: list[int]) -> list[Path]:
    """Every run of the given counting tasks, in task order."""
    out = []
    for i in indices:
        n = json.loads(count_marker(work, i).read_text())["runs"]
        out.extend(work / f"count-{i:05d}" / f"run-{r:03d}" for r in range(n))
    return out


def _range_end(runs: list[tuple[np.ndarray, np.ndarray]], pos: list[int], limit: int) -> int | None:
    """An exclusive value bound such that the runs hold at most `limit` pairs in [their pos, bound).

    With q = limit // active runs, the smallest of the values q past each run's position is such a
    bound (no run has more than q pairs below it) and moves at least q pairs on; None: all the
    rest fits.
    """
    active = [i for i, (v, _) in enumerate(runs) if pos[i] < len(v)]
    q = limit // max(len(active), 1)
    if q < 1:
        raise ValueError(
            f"vocabulary memory budget of {limit} pairs is below the {len(active)} count runs it must merge; "
            "raise --vocab-memory-mb"
        )
    ahead = [int(runs[i][0][pos[i] + q]) for i in active if pos[i] + q < len(runs[i][0])]
    return min(ahead) if ahead else None


def merge_runs(runs: list[tuple[np.ndarray, np.ndarray]], limit: int):
    """Yield the summed (values, counts) of sorted runs in ascending value ranges of <= limit
    pairs."""
    pos = [0] * len(runs)
    while any(p < len(v) for p, (v, _) in zip(pos, runs)):
        bound = _range_end(runs, pos, limit)
        pieces = []
        for i, (v, c) in enumerate(runs):
            end = (
                len(v)
                if bound is None
                else pos[i] + int(np.searchsorted(v[pos[i] :], np.uint64(bound)))
            )
            if end > pos[i]:
                pieces.append((np.asarray(v[pos[i] : end]), np.asarray(c[pos[i] : end])))
            pos[i] = end
        yield merge_counts(pieces)


def _assign_ids(counts_path: Path, ids: _Appender, hist: dict[int, int], limit: int) -> None:
    """ids of the kept values (in value order) from their counts: decreasing count, ties by
    value."""
    distinct = np.array(sorted(hist, reverse=True), dtype=np.int64)
    sizes = np.array([hist[int(c)] for c in distinct], dtype=np.int64)
    start = 2 + np.concatenate(
        [[0], np.cumsum(sizes)[:-1]]
    )  # first id of each count, largest count first
    seen = np.zeros(len(distinct), dtype=np.int64)
    counts = np.load(counts_path, mmap_mode="r")
    for a in range(0, len(counts), limit):
        c = np.asarray(counts[a : a + limit])
        k = (
            len(distinct) - 1 - np.searchsorted(distinct[::-1], c)
        )  # index of each count in `distinct`
        order = np.argsort(k, kind="stable")  # value order kept within a count
        ks = k[order]
        first = np.searchsorted(ks, ks, side="left")
        out = np.empty(len(c), dtype=ids.dtype)
        out[order] = (start[ks] + seen[ks] + (np.arange(len(c)) - first)).astype(ids.dtype)
        seen += np.bincount(k, minlength=len(distinct))
        ids.append(out)


def _narrowest(largest: int) -> np.dtype:
    return np.dtype(np.uint32) if largest <= np.iinfo(np.uint32).max else np.dtype(np.uint64)


def build_feature(
    runs: list[Path], name: str, min_count: int, memory_bytes: int, vocab_dir: Path
) -> tuple[int, int]:
    """Merge one feature's runs into `{name}.values.npy` / `.ids.npy`; returns (kept values,
    ranges).

    Both files are uint32 where their largest entry fits (Criteo's 32-bit hex values, fewer than 4 G
    ids): every worker maps them whole, and on 52 M distinct values they were 832 MB of uint64."""
    limit = budget_entries(memory_bytes)
    mapped = [
        (
            np.load(r / f"{name}.values.npy", mmap_mode="r"),
            np.load(r / f"{name}.counts.npy", mmap_mode="r"),
        )
        for r in runs
    ]
    largest = max((int(v[-1]) for v, _ in mapped if len(v)), default=0)  # runs are sorted
    values, counts = (
        _Appender(vocab_dir / f"{name}.values.npy", _narrowest(largest)),
        _Appender(vocab_dir / f".{name}.counts.npy", np.int64),
    )
    hist: dict[int, int] = {}
    ranges = 0
    for v, c in merge_runs(mapped, limit):
        keep = c >= min_count
        values.append(v[keep])
        counts.append(c[keep])
        for cv, n in zip(*np.unique(c[keep], return_counts=True)):
            hist[int(cv)] = hist.get(int(cv), 0) + int(n)
        ranges += 1
    values.close()
    counts.close()
    ids = _Appender(vocab_dir / f"{name}.ids.npy", _narrowest(values.n + 1))
    _assign_ids(counts.path, ids, hist, limit)
    ids.close()
    counts.path.unlink()
    return values.n, ranges


def build_vocabularies(
    runs: list[Path], names: list[str], min_count: int, memory_bytes: int, vocab_dir: Path
) -> dict:
    """Every feature's vocabulary files, then `vocab.json` (cardinalities, ranges) written last."""
    vocab_dir.mkdir(parents=True, exist_ok=True)
    cards, ranges = [], []
    for name in names:
        kept, r = build_feature(runs, name, min_count, memory_bytes, vocab_dir)
        cards.append(kept + 2)
        ranges.append(r)
    fsync_dir(vocab_dir)  # every feature's renames, once, before vocab.json publishes them
    info = {
        "names": names,
        "cardinalities": cards,
        "merge_ranges": ranges,
        "runs": len(runs),
        "memory_bytes": int(memory_bytes),
    }
    atomic_write_bytes(vocab_dir / "vocab.json", json.dumps(info).encode())
    release_freed_memory()
    return info


def release_freed_memory() -> None:
    # glibc keeps the merge's freed arrays in this process's heap (~100 MB on 52 M pairs), held for
    # nothing while the workers map the vocabularies; malloc_trim gives them back. Elsewhere:
    # nothing.
    try:
        ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass


def load_vocabularies(vocab_dir: Path, names: list[str]) -> list[Vocabulary]:
    """Each feature's vocabulary, memory-mapped (read-only; shared by every worker's page cache)."""
    return [
        Vocabulary(
            np.load(vocab_dir / f"{n}.values.npy", mmap_mode="r"),
            np.load(vocab_dir / f"{n}.ids.npy", mmap_mode="r"),
        )
        for n in names
    ]


_CACHE: dict[tuple, list[Vocabulary]] = {}


def cached_vocabularies(vocab_dir: Path, names: list[str]) -> list[Vocabulary]:
    """load_vocabularies, once per process and vocabulary (a pool worker maps them for its first
    task only). Keyed by the vocab.json written last, not by the path: a run that preprocesses
    into a directory rebuilt since (same path, new vocabularies) must not look its ids up in the
    maps of the deleted ones, which stay readable and would give a wrong dataset silently."""
    st = (vocab_dir / "vocab.json").stat()
    key = (str(vocab_dir.resolve()), st.st_dev, st.st_ino, st.st_mtime_ns, tuple(names))
    if key not in _CACHE:
        _CACHE.clear()  # one vocabulary at a time: an older one's maps are not kept open
        _CACHE[key] = load_vocabularies(vocab_dir, names)
    return _CACHE[key]
