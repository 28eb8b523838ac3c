"""The MLPerf DLRMv2 reference's preprocessing of Criteo 1TB day files, in bounded memory.

The reference (mlcommons/training recommendation_v2/torchrec_dlrm/scripts/
process_Criteo_1TB_Click_Logs_dataset.sh) runs torchrec's three Criteo scripts; this module
writes the same `day_N_{dense,sparse,labels}.npy` arrays, byte for byte, without their memory
(torchrec's README: ~700 GB for the ids, and the shuffle holds all training days as one float32
matrix, ~670 GB):

1. parse (npy_preproc_criteo): missing values are 0; labels int32 [n, 1]; dense values float32
   [n, 13] by the named transform (DENSE_TRANSFORMS); raw hex ids int64 [n, 26]. Streamed in
   chunks through shardrec's parser; raw dense integers are kept as int32 until the day's
   minimum is known (log-min2 needs it).
2. contiguous ids (contiguous_preproc_criteo, frequency threshold 0): per column, ids 2, 3, ...
   by first occurrence over the days in order. Per column, each day's distinct values with their
   first row are reduced chunk by chunk, then merged over the days; memory is 16 bytes per pair
   held: the column's distinct values summed over the days (one column at a time; a few GB for
   Criteo 1TB's largest columns). Ids are then mapped by binary search in the sorted values.
3. shuffle (shuffle_preproc_criteo, seed 0): the training days (all but the last) concatenated and
   permuted by np.random.RandomState(seed).permutation(rows) -- the permutation np.random.shuffle
   applies to torchrec's matrix -- then cut back into days of the original sizes; sparse ids pass
   through float32 to int32 as torchrec's matrix makes them (ids above 2**24 are rounded there).
   The permutation itself is held in memory: 8 bytes per training row (34 GB for Criteo 1TB's
   4.2 B rows), the one cost that grows with the data; the rows are gathered chunk by chunk from
   memory-mapped arrays. The last day is written unshuffled (torchrec copies it), its ids in the
   dtype step 2 gave them: int32 with torchrec 0.3.2's scripts (the reference's, `log3`), int64
   with today's (`log-min2`); its ids never pass through float32.

Restartable: every file is written under a temporary name and renamed, and a rerun skips each
file already in place (intermediate files live in OUT/.work, removed at the end). What made the
arrays is recorded in OUT/reference-npy.json (reference_run.py): a rerun with other inputs, seed or
dense transform is refused rather than given the old arrays.
The reference's `% num_embeddings_per_feature` is the loader's (data.multihot_rows) or
`shardrec data import-npy --max-ids`.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardrec.tools.preprocess.derived.reference_run import (
    WORK,
    check_day_order,
    check_record,
    run_record,
)
from shardrec.tools.preprocess.parse.criteo_text import (
    REASONS,
    Schema,
    describe_bad_row,
    parse_chunk,
)
from shardrec.tools.preprocess.text.gz import READ_ERRORS, describe_error, open_text
from shardrec.tools.preprocess.text.lines import TSV_BLANK, blank_tail

logger = logging.getLogger(__name__)

DENSE_TRANSFORMS = ("log3", "log-min2")
"""log3: log(x + 3) (torchrec 0.3.2, which made the reference's published arrays); log-min2:
log(x - min + 2), min over the whole day file (today's torchrec scripts)."""
LAST_DAY_IDS = {"log3": np.int32, "log-min2": np.int64}
"""The dtype of the last day's ids, which the shuffle copies as step 2 wrote them: torchrec
0.3.2 (the reference's requirements.txt; its md5sums) parses ids into int32 and keeps them so,
today's torchrec into int64. The shuffled days are int32 in both."""
CHUNK_BYTES = 64 << 20
CHUNK_ROWS = 1 << 20
SCHEMA = Schema()


def _save(path: Path, array: np.ndarray) -> None:
    """np.save under a temporary name, then renamed into place."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        np.save(f, array)
    os.replace(tmp, path)


def _chunks(path: Path) -> Iterator[bytes]:
    """The file's text (decompressed where the name ends in .gz, as `shardrec preprocess` reads
    it) in pieces that end at a newline, less the blank lines that end it (text.lines: no rows, as
    every other reader of a day file takes them; torchrec's scripts stop at them with an
    IndexError). ValueError names an unreadable or truncated file."""
    rest, held = b"", b""  # held: blank lines that end the text so far, rows or the end to come
    with open_text(path) as f:
        while True:
            try:
                block = f.read(CHUNK_BYTES)
            except READ_ERRORS as e:
                raise ValueError(describe_error(path, e, f)) from None
            if not block:
                break
            cut = (rest + block).rfind(b"\n") + 1
            text, rest = (rest + block)[:cut], (rest + block)[cut:]
            end = blank_tail(text, 0, len(text))
            if end:  # a row follows the held lines: they are lines of the text (malformed rows)
                yield held + text[:end]
                held = b""
            held += text[end:]
    if rest.translate(None, TSV_BLANK):
        yield held + rest + b"\n"


def _check_log3(path: Path, line: int, dense: np.ndarray) -> None:
    """The reference's log3 of an integer below -2 is -inf or NaN (torchrec fixed it with
    log-min2, whose values are all finite): refused, naming the first such value."""
    bad = np.argwhere(dense < -2)
    if len(bad):
        row, col = (int(v) for v in bad[0])
        value = int(dense[row, col])
        raise ValueError(
            f"{path}:{line + row}: I{col + 1}: {value}: log({value} + 3) is "
            f"{'-inf' if value == -3 else 'NaN'} (the reference's log3 has no finite value for "
            "integers below -2); rerun with --dense log-min2, today's torchrec transform "
            "log(x - day minimum + 2)"
        )


def parse_day(path: Path, work: Path, day: int, dense_transform: str = "log3") -> None:
    """Step 1 for one day file: work/day_N_{dense_raw,sparse_raw,labels}.npy. ValueError names
    the first malformed row, or under log3 the first value whose log would not be finite."""
    if (work / f"day_{day}_labels.npy").exists():
        return
    rows = sum(text.count(b"\n") for text in _chunks(path))
    dense = np.lib.format.open_memmap(
        work / f"day_{day}_dense_raw.npy.tmp", "w+", np.int32, (rows, 13)
    )
    sparse = np.lib.format.open_memmap(
        work / f"day_{day}_sparse_raw.npy.tmp", "w+", np.int64, (rows, 26)
    )
    labels = np.empty((rows, 1), dtype=np.int32)
    at, line = 0, 1
    for text in _chunks(path):
        chunk = parse_chunk(text, SCHEMA)
        bad = np.flatnonzero(chunk.reason >= 0)
        if bad.size:
            field, shown = describe_bad_row(text, chunk, int(bad[0]), SCHEMA)
            reason = REASONS[int(chunk.reason[int(bad[0])])]
            raise ValueError(
                f"{path}:{line + int(bad[0])}: {field}: {shown} ({reason}); the reference parses "
                "every row, skipping none: correct the row or remove it"
            )
        if dense_transform == "log3":
            _check_log3(path, line, chunk.dense)
        n = len(chunk.labels)
        labels[at : at + n, 0] = chunk.labels
        dense[at : at + n] = chunk.dense  # 0 where missing, as torchrec's int(x or "0")
        sparse[at : at + n] = chunk.sparse.view(np.int64)
        at, line = at + n, line + n
    for array, name in ((dense, "dense_raw"), (sparse, "sparse_raw")):
        array.flush()
        os.replace(work / f"day_{day}_{name}.npy.tmp", work / f"day_{day}_{name}.npy")
    _save(work / f"day_{day}_labels.npy", labels)


def reference_dense(raw: np.ndarray, how: str, day_min: int) -> np.ndarray:
    """torchrec's dense transform of int32 values, in its int32-then-float32 arithmetic."""
    shifted = raw + np.int32(3) if how == "log3" else raw - np.int32(day_min - 2)
    return np.log(shifted.astype(np.int32, copy=False), dtype=np.float32)


def _first_occurrences(days: list[np.ndarray], col: int) -> tuple[np.ndarray, np.ndarray]:
    """Column `col`'s distinct values, sorted, with the global row of each one's first
    occurrence."""
    values, firsts, offset = [], [], 0
    for sparse in days:
        day_v, day_f = [], []
        for start in range(0, len(sparse), CHUNK_ROWS):
            v, f = np.unique(np.asarray(sparse[start : start + CHUNK_ROWS, col]), return_index=True)
            day_v.append(v)
            day_f.append(f + start)
        v, f = _min_first(np.concatenate(day_v), np.concatenate(day_f))
        values.append(v)
        firsts.append(f + offset)
        offset += len(sparse)
    return _min_first(np.concatenate(values), np.concatenate(firsts))


def _min_first(values: np.ndarray, firsts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((firsts, values))
    values, firsts = values[order], firsts[order]
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return values[keep], firsts[keep]


def contiguous_ids(work: Path, num_days: int) -> None:
    """Step 2: work/day_N_ids.npy, ids 2, 3, ... by first occurrence over the days in order."""
    if all((work / f"day_{d}_ids.npy").exists() for d in range(num_days)):
        return
    raw = [np.load(work / f"day_{d}_sparse_raw.npy", mmap_mode="r") for d in range(num_days)]
    outs = [
        np.lib.format.open_memmap(work / f"day_{d}_ids.npy.tmp", "w+", np.int64, raw[d].shape)
        for d in range(num_days)
    ]
    for col in range(raw[0].shape[1]):
        values, firsts = _first_occurrences(raw, col)
        ids = np.empty(len(values), dtype=np.int64)
        ids[np.argsort(firsts, kind="stable")] = np.arange(2, 2 + len(values))
        for sparse, out in zip(raw, outs):
            for start in range(0, len(sparse), CHUNK_ROWS):
                piece = np.asarray(sparse[start : start + CHUNK_ROWS, col])
                out[start : start + len(piece), col] = ids[np.searchsorted(values, piece)]
    for d, out in enumerate(outs):
        out.flush()
        os.replace(work / f"day_{d}_ids.npy.tmp", work / f"day_{d}_ids.npy")


def _day_min(work: Path, day: int) -> int:
    raw = np.load(work / f"day_{day}_dense_raw.npy", mmap_mode="r")
    return min(
        (int(raw[s : s + CHUNK_ROWS].min()) for s in range(0, len(raw), CHUNK_ROWS)), default=0
    )


@dataclass(frozen=True)
class _Parsed:
    """Steps 1-2's arrays of every day (memory-mapped), and how dense values are transformed."""

    dense_raw: list[np.ndarray]
    ids: list[np.ndarray]
    labels: list[np.ndarray]
    mins: list[int]
    dense: str

    @classmethod
    def load(cls, work: Path, num_days: int, dense: str) -> _Parsed:
        def days(kind: str) -> list[np.ndarray]:
            return [np.load(work / f"day_{d}_{kind}.npy", mmap_mode="r") for d in range(num_days)]

        mins = [_day_min(work, d) if dense == "log-min2" else 0 for d in range(num_days)]
        return cls(days("dense_raw"), days("ids"), days("labels"), mins, dense)

    def rows(self, day: int, picked: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Dense (transformed), ids and labels of rows `picked` (ascending) of `day`."""
        dense = reference_dense(np.asarray(self.dense_raw[day][picked]), self.dense, self.mins[day])
        return dense, np.asarray(self.ids[day][picked]), np.asarray(self.labels[day][picked])


def write_days(work: Path, out: Path, num_days: int, dense: str, seed: int) -> None:
    """Step 3: the training days shuffled together and cut back into days; the last day as it is."""
    parsed = _Parsed.load(work, num_days, dense)
    last = num_days - 1
    sizes = [len(a) for a in parsed.ids]
    ids_dtype = LAST_DAY_IDS[dense]

    def last_day(rows: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        dense_values, ids, labels = parsed.rows(last, np.arange(rows.start, rows.stop))
        return dense_values, ids.astype(ids_dtype, copy=False), labels

    _write_day(out / f"day_{last}", sizes[last], last_day)
    if all((out / f"day_{d}_labels.npy").exists() for d in range(last)):
        return
    starts = np.cumsum([0, *sizes[:last]])
    perm = np.random.RandomState(seed).permutation(int(starts[-1]))

    def shuffled(rows: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        wanted = perm[rows]
        which = np.searchsorted(starts, wanted, side="right") - 1
        dense, ids = np.empty((len(wanted), 13), np.float32), np.empty((len(wanted), 26), np.int64)
        labels = np.empty((len(wanted), 1), np.int32)
        for d in np.unique(which):
            at = np.flatnonzero(which == d)
            local = wanted[at] - starts[d]
            order = np.argsort(local)  # each day's rows read in file order
            dense[at[order]], ids[at[order]], labels[at[order]] = parsed.rows(d, local[order])
        # torchrec shuffles one float32 matrix and casts ids and labels back to int32.
        return (
            dense,
            ids.astype(np.float32).astype(np.int32),
            labels.astype(np.float32).astype(np.int32),
        )

    for d in range(last):
        base = int(starts[d])
        _write_day(
            out / f"day_{d}",
            sizes[d],
            lambda rows, base=base: shuffled(slice(base + rows.start, base + rows.stop)),
        )


def _write_day(prefix: Path, rows: int, source: Callable[[slice], tuple[np.ndarray, ...]]) -> None:
    """PREFIX_{dense,sparse,labels}.npy, CHUNK_ROWS rows at a time from `source` (skipped if
    written)."""
    if Path(f"{prefix}_labels.npy").exists():
        return
    first = source(slice(0, 0))
    files = [Path(f"{prefix}_{kind}.npy") for kind in ("dense", "sparse", "labels")]
    tmps = [f.with_name(f.name + ".tmp") for f in files]
    outs = [
        np.lib.format.open_memmap(t, mode="w+", dtype=a.dtype, shape=(rows, a.shape[1]))
        for t, a in zip(tmps, first)
    ]
    for start in range(0, rows, CHUNK_ROWS):
        piece = slice(start, min(rows, start + CHUNK_ROWS))
        for target, part in zip(outs, source(piece)):
            target[piece] = part
    for target, tmp, final in zip(outs, tmps, files):
        target.flush()
        os.replace(
            tmp, final
        )  # labels last: a rerun skips the day only when all three are in place


def reference_preprocess(
    days: list[Path], out: Path, dense: str = "log3", seed: int = 0
) -> list[int]:
    """The reference's arrays of `days` (in order; the last is val + test) in `out`; returns rows
    per day."""
    if dense not in DENSE_TRANSFORMS:
        raise ValueError(f"dense transform {dense!r} is not one of {', '.join(DENSE_TRANSFORMS)}")
    if len(days) < 2:
        raise ValueError(
            f"{len(days)} day file(s): the reference needs training days and a last day (val + test)"
        )
    check_day_order(days)
    check_record(out, run_record(days, dense, seed))
    work = out / WORK
    work.mkdir(parents=True, exist_ok=True)
    for d, path in enumerate(days):
        logger.info("parsing %s", path)
        parse_day(path, work, d, dense)
    logger.info("contiguous ids")
    contiguous_ids(work, len(days))
    logger.info("shuffling the training days (seed %d) and writing", seed)
    write_days(work, out, len(days), dense, seed)
    rows = [len(np.load(out / f"day_{d}_labels.npy", mmap_mode="r")) for d in range(len(days))]
    shutil.rmtree(work)
    return rows
