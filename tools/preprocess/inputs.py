"""What work a preprocessing run consists of: input files, splits, and byte-range tasks.

The plan is a pure function of the inputs and the options (never of `--workers`), which is
what makes the output byte-identical whatever the worker count and after a restart.

Splits follow the two Criteo layouts:
- kaggle (one file): lines are cut into 7 pseudo-days, day d holding lines
  [d*L//7, (d+1)*L//7); days 0-5 train, day 6 halved into val and test;
- days (several files, e.g. day_0 .. day_23): every file but the last is a training day,
  the last is halved into val and test.
Which half is val is `val_half` (default "first", as torchrec does); the manifest records it.
Lines are physical lines (malformed rows included), so a split never depends on row content;
the blank lines that end a file are none (text.lines.text_end), so a file splits as it would
without them.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from shardrec.tools.preprocess.parse.parquet_rows import file_rows, plan_row_groups
from shardrec.tools.preprocess.parse.parquet_schema import is_parquet
from shardrec.tools.preprocess.tasks.task import SplitRange, Task
from shardrec.tools.preprocess.text.gz_split import GzipScan, scan_gzip, should_split
from shardrec.tools.preprocess.text.lines import (
    TSV_BLANK,
    RowEnd,
    byte_at,
    chunk_bounds,
    count_lines,
    count_range_lines,
    header_end,
    text_end,
)

logger = logging.getLogger(__name__)
KAGGLE_DAYS = 7
LAYOUTS = ("auto", "kaggle", "days")


def _natural_key(path: Path) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path.name))


# What a directory input takes: Criteo's day files (1TB: day_0 .. day_23), Kaggle's train.txt and
# dac_sample.txt, gzipped or not, bare or with the extension of the rows' format (.txt/.tsv for
# tab-separated rows, .csv for comma-separated ones), or the files a spec's `[format] files`
# pattern names. Anything else beside them (a README, checksums, a half-downloaded
# day_23.gz.part, a CSV beside Kaggle's train.txt) would otherwise become a day of its own.
_NAMES = r"(day_\d+|train|dac_sample)"
INPUT_NAME = re.compile(rf"^{_NAMES}(\.(txt|tsv))?(\.gz)?$")
CSV_INPUT_NAME = re.compile(rf"^{_NAMES}(\.csv)?(\.gz)?$")


@dataclass(frozen=True)
class InputNames:
    """Which files of a directory are inputs: Criteo's names in the rows' format (csv: .csv), or
    a glob pattern (a spec's `[format] files`)."""

    csv: bool = False
    pattern: str = ""
    parquet: bool = False
    """Parquet inputs: a directory gives its `*.parquet` files (natural order) unless `pattern`."""

    def match(self, name: str) -> bool:
        if self.pattern:
            return fnmatch.fnmatchcase(name, self.pattern)
        if self.parquet:
            return name.endswith(".parquet")
        return bool((CSV_INPUT_NAME if self.csv else INPUT_NAME).match(name))

    def __str__(self) -> str:
        if self.pattern:
            return f"{self.pattern!r} (the spec's [format] files)"
        if self.parquet:
            return "*.parquet"
        if self.csv:
            return "day_N[.csv][.gz], train.csv[.gz] or dac_sample.csv"
        return "day_N[.gz], train.txt[.gz] or dac_sample.txt"


def _directory_inputs(directory: Path, names: InputNames) -> list[Path]:
    """The input files of a directory in day order; logs one line naming the files it ignored."""
    files = [c for c in directory.iterdir() if c.is_file() and not c.name.startswith(".")]
    taken = sorted((c for c in files if names.match(c.name)), key=_natural_key)
    ignored = sorted(c.name for c in files if not names.match(c.name))
    listed = ", ".join(ignored[:8]) + (f" and {len(ignored) - 8} more" if len(ignored) > 8 else "")
    if not taken:
        raise ValueError(
            f"{directory}: directory holds no input files named {names}"
            + (
                f" (found {listed}; name input files on the command line to take them"
                + ("" if names.pattern else ", or give a spec a [format] files pattern")
                + ")"
                if ignored
                else ""
            )
        )
    if ignored:
        logger.warning(
            "%s: ignored %d file(s) not named %s: %s", directory, len(ignored), names, listed
        )
    return taken


class RowsRefused(ValueError):
    """A refusal of the input's rows (kept_rows.check_rows_kept, plan_tasks). `final`: no
    --max-skipped-fraction lets the run finish (no data line, no row kept, a split of skipped
    lines alone): its finished tasks are of no use to a rerun, which needs other input or another
    spec."""

    def __init__(self, message: str, final: bool) -> None:
        super().__init__(message)
        self.final = final


def discover_inputs(inputs: list[Path], names: InputNames = InputNames()) -> list[Path]:
    """Files named on the command line (taken whatever their name), and directories expanded to
    their input files (`names`) in day order."""
    files: list[Path] = []
    for p in inputs:
        if p.is_dir():
            files.extend(_directory_inputs(p, names))
        elif p.is_file():
            files.append(p)
        else:
            raise ValueError(f"{p}: no such file or directory")
    for f in files:
        if not os.access(f, os.R_OK):
            raise ValueError(f"{f}: not readable")
        if f.stat().st_size == 0:
            raise ValueError(f"{f}: empty file")
        if names.parquet and not is_parquet(f):
            raise ValueError(f'{f}: not a Parquet file (the spec reads Parquet: kind = "parquet")')
    return files


def halve(first: int, total: int, val_half: str) -> tuple[SplitRange, SplitRange]:
    """Lines [first, total) cut in two; the first half is val unless val_half='second'.

    The first half gets the odd line, as in torchrec's InMemoryBinaryCriteoIterDataPipe, so a
    dataset exported to its layout splits the same way there.
    """
    mid = first + (total - first + 1) // 2
    a, b = ("val", "test") if val_half == "first" else ("test", "val")
    return SplitRange(a, first, mid), SplitRange(b, mid, total)


def split_ranges(layout: str, is_last: bool, lines: int, val_half: str) -> tuple[SplitRange, ...]:
    if layout == "kaggle":
        first_eval = (KAGGLE_DAYS - 1) * lines // KAGGLE_DAYS
        return (SplitRange("train", 0, first_eval), *halve(first_eval, lines, val_half))
    return halve(0, lines, val_half) if is_last else ()


def resolve_layout(layout: str, files: list[Path]) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    if layout == "auto":
        return "kaggle" if len(files) == 1 else "days"
    if layout == "days" and len(files) < 2:
        raise ValueError(
            "layout 'days' needs at least two day files (the last one is halved into val/test)"
        )
    return layout


# Runs the tasks of a large .gz file while decoding it once (gz_stream.stream_gzip bound to the
# run's options): (file, its position, its first task's index, chunk_bytes, header, its split
# ranges for a line count) -> its cut.
GzipStream = Callable[
    [Path, int, int, int, bool, Callable[[int], tuple[SplitRange, ...]]], GzipScan
]


def plan_tasks(
    files: list[Path],
    layout: str,
    val_half: str,
    chunk_bytes: int,
    header: bool,
    work_dir: Path | None = None,
    stream: GzipStream | None = None,
    parquet: bool = False,
    row_end: RowEnd | None = None,
    blank: bytes = TSV_BLANK,
) -> list[Task]:
    """Cut the inputs into tasks. Files that are split by line number get their lines counted;
    Parquet files (`parquet`) are cut into runs of row groups, their rows read from their metadata.

    work_dir: where the cut of a large gzip file and its seek index are kept for a rerun (gz_split).
    stream: runs a large .gz file's tasks as it decodes it (the planning pass is their producer);
    they are planned as usual and found finished. None: a planning pass cuts it (gz_split).
    row_end: text is cut only where it finds a row's end (quoted fields may hold line breaks).
    blank: what a blank line holds (text.lines.blank_bytes): those that end a file are no lines.
    """
    tasks: list[Task] = []
    for fi, path in enumerate(files):
        is_last = fi == len(files) - 1
        needs_lines = layout == "kaggle" or is_last
        if parquet:  # rows from its metadata; tasks are runs of its row groups
            ranges = split_ranges(layout, is_last, file_rows(path), val_half) if needs_lines else ()
            for g in plan_row_groups(path, chunk_bytes):
                tasks.append(Task(len(tasks), str(path), g.first, g.last, g.first_row, ranges,
                                  "train", False, parquet_bytes=g.bytes))  # fmt: skip
            continue
        # Only a file whose lines are counted anyway (kaggle's one file, the last day) is split: its
        # planning pass replaces the count; a training day among others stays one task (gz_split).
        if str(path).endswith(".gz") and needs_lines and should_split(path, chunk_bytes):
            if stream is not None:
                splits = partial(
                    split_ranges, layout, is_last, val_half=val_half
                )  # of its line count
                scan = stream(path, fi, len(tasks), chunk_bytes, header, splits)
            else:
                scan = scan_gzip(path, fi, chunk_bytes, header, work_dir, row_end, blank)
            ranges = split_ranges(layout, is_last, scan.total_lines, val_half)
            firsts = [sum(scan.counts[:i]) for i in range(len(scan.counts))]
            for (start, end), first, crc in zip(scan.bounds, firsts, scan.crcs):
                tasks.append(
                    Task(
                        len(tasks),
                        str(path),
                        start,
                        end,
                        first,
                        ranges,
                        "train",
                        header,
                        scan.index,
                        crc,
                    )
                )
            continue
        if str(path).endswith(".gz"):
            ranges = (
                split_ranges(layout, is_last, count_lines(path, header, blank), val_half)
                if needs_lines
                else ()
            )
            tasks.append(Task(len(tasks), str(path), 0, -1, 0, ranges, "train", header))
            continue
        begin = header_end(path) if header else 0
        end = text_end(path, begin, blank)
        if end == begin < path.stat().st_size:  # as an empty file is (discover_inputs)
            after = " after its header" if header else ""
            raise RowsRefused(
                f"{path}: only blank lines{after}, no rows: take it out of the inputs", final=True
            )
        bounds = chunk_bounds(path, chunk_bytes, begin, row_end, end)
        firsts, ranges = [-1] * len(bounds), ()
        if needs_lines:
            counts = [count_range_lines(path, s, e) for s, e in bounds]
            firsts = [sum(counts[:i]) for i in range(len(counts))]
            total = sum(counts) + (end > begin and byte_at(path, end - 1) != b"\n")
            ranges = split_ranges(layout, is_last, total, val_half)
        for (start, end), first in zip(bounds, firsts):
            tasks.append(Task(len(tasks), str(path), start, end, first, ranges, "train", header))
    return tasks
