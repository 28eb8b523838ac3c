"""What `shardrec preprocess` shows: the progress bar with its rates, the tables of rows and
features and the last line's rate, the JSON summary, and the warning for a split of one class."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from rich.progress import Progress
from rich.table import Table

from shardrec.tools.cli.data.view import SHARE_HEADERS
from shardrec.tools.console import console, err_console

if TYPE_CHECKING:
    from shardrec.tools.preprocess.kept_rows import PreprocessResult


class Bar:
    """Progress sink drawing a rich bar with rows/s and MB/s of text parsed.

    The bar appears at the first pass (an input error found before it draws no empty bar), and
    the parse pass's own time and bytes are kept, so that the last line states the rate it showed.
    Under compiles_apart(), numba's compiles (a kernel's first use, not in its cache yet) are
    left out of a pass's seconds and kept apart (compile_seconds).
    """

    def __init__(self, progress: Progress) -> None:
        self.progress, self.task, self.shown = progress, None, False
        self.t0, self.rows, self.text, self.disk = time.perf_counter(), 0, 0, 0
        self.parse_seconds, self.parsed_text, self.compile_seconds = 0.0, 0, 0.0
        self.compiles, self.compiled_before = None, 0.0  # numba's TimingListener, and its start

    @contextmanager
    def compiles_apart(self) -> Iterator[None]:
        """Time numba's compiles in this process meanwhile: a first run compiled the kernels its
        pass called for seconds, which its rate counted as parsing (0.0 MB/s for a small file)."""
        from shardrec.dataloader.util.jit import AVAILABLE

        if not AVAILABLE:
            yield
            return
        from numba.core import event

        with event.install_listener("numba:compile", event.TimingListener()) as self.compiles:
            yield

    def _compiled(self) -> float:
        c = self.compiles
        return c.duration if c is not None and c.done else 0.0

    def start(self, total_bytes: int, label: str) -> None:
        if not self.shown:
            self.progress.start()
            self.shown = True
        self.t0, self.rows, self.text, self.disk = time.perf_counter(), 0, 0, 0
        self.compiled_before = self._compiled()
        self.task = self.progress.add_task(label, total=max(total_bytes, 1), rate="")

    def advance(self, disk_bytes: int, text_bytes: int, lines: int) -> None:
        self.rows += lines
        self.text += text_bytes
        self.disk += disk_bytes
        compiling = self._compiled() - self.compiled_before
        dt = max(time.perf_counter() - self.t0 - compiling, 1e-9)
        if self.rows:
            self.parse_seconds, self.parsed_text, self.compile_seconds = dt, self.text, compiling
            rate = f"{self.rows / dt:,.0f} rows/s  {self.text / dt / 1e6:,.1f} MB/s"
        else:  # the counting pass reports no rows
            rate = f"{self.disk / dt / 1e6:,.1f} MB/s"
        self.progress.update(self.task, advance=disk_bytes, rate=rate)


def warn_one_class(out: Path, manifest) -> None:
    """A warning (stderr) for each split whose labels are all one class: its AUC cannot be
    measured, and a train split of one class teaches nothing; most often a label column or rule
    that does not say what the user meant."""
    from shardrec.dataloader.format.integrity import one_label
    from shardrec.dataloader.format.part_file import manifest_layout, open_part

    layout = manifest_layout(manifest, out)
    for split, info in manifest.splits.items():
        label = one_label(open_part(out, split, p, manifest, layout) for p in info.parts)
        if label is not None:
            spec = manifest.options.get("spec")
            rule = " (check the spec's label column and its threshold or mapping)" if spec else ""
            err_console.print(
                f"warning: {out}: every label of split {split} is {label}: an AUC needs both "
                f"0 and 1{rule}",
                highlight=False,
                soft_wrap=True,
            )


def as_json(result: PreprocessResult, seconds: float) -> dict:
    m = result.manifest
    return {
        "complete": m is not None,
        "lines": result.lines,
        "text_bytes": result.bytes,
        "rows_kept": result.kept,
        "rows_skipped": result.skipped,
        "first_errors": result.errors,
        "lists_cut": {name: asdict(c) for name, c in result.lists_cut.items()},
        "tasks_run": result.tasks_run,
        "tasks_total": result.tasks_total,
        "seconds": round(seconds, 3),
        "cpu_seconds_by_stage": result.cpu_s_by_stage,
        "cardinality": {f.name: f.cardinality for f in m.sparse_features} if m else None,
    }


def print_tables(result: PreprocessResult, seconds: float, bar: Bar, parquet: bool) -> None:
    rows = Table(title="rows")
    rows.add_column("split / reason")
    rows.add_column("rows", justify="right")
    for split, n in result.kept.items():
        rows.add_row(f"kept: {split}", f"{n:,}")
    for reason, n in result.skipped.items():
        rows.add_row(f"skipped: {reason}", f"{n:,}")
    console.print(rows)
    for line in result.errors:  # text, not markup: a value or "[format] missing" prints as read
        console.print(f"  {line}", highlight=False, markup=False)
    from shardrec.tools.preprocess.tasks.bad_rows import list_cut_lines

    keep = "raise max_length in the spec to keep them"
    for line in list_cut_lines(result.lists_cut, sum(result.kept.values()), keep):
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    if result.manifest is None:
        console.print(
            f"ran {result.tasks_run} task(s); others are unfinished: rerun without --part to finish and merge"
        )
        return
    feats = Table(title="features (train)")  # counted on the training split, as data stats says
    for col in ("feature", "cardinality", "dtype", "distinct ids", SHARE_HEADERS["top1_share"]):
        feats.add_column(col, justify="right" if col != "feature" else "left")
    for f in result.manifest.sparse_features:
        feats.add_row(
            f.name,
            f"{f.cardinality:,}" if f.cardinality else "raw ids",  # 64-bit ids, no table size
            f.dtype,
            f"{int(f.stats.get('distinct_ids', 0)):,}",
            f"{f.stats.get('top1_share', 0):.1%}",  # as `data stats` shows it, under its header
        )
    console.print(feats)
    console.print(rate_line(result, seconds, bar, parquet), highlight=False)


def rate_line(result: PreprocessResult, seconds: float, bar: Bar, parquet: bool) -> str:
    """The last line: the parse rate the bar showed (same bytes, same seconds), or no rate at all
    when every task was already done. Parquet's bytes are its columns' uncompressed size (its
    metadata's), read, not parsed."""
    read = (
        f"{result.lines:,} rows, {result.bytes / 1e6:,.1f} MB of Parquet columns (uncompressed)"
        if parquet
        else f"{result.lines:,} lines, {result.bytes / 1e6:,.1f} MB of text"
    )
    if result.tasks_run == 0:
        return (
            f"nothing to do: all {result.tasks_total} task(s) were already done; {read} "
            f"({seconds:.1f} s)"
        )
    mbps = bar.parsed_text / max(bar.parse_seconds, 1e-9) / 1e6
    compiled = (
        f", plus {bar.compile_seconds:.1f} s compiling kernels: a first run's only"
        if bar.compile_seconds >= 0.05
        else ""
    )
    return (
        f"{read}; {'read' if parquet else 'parsed'} at {mbps:,.1f} MB/s "
        f"({bar.parsed_text / 1e6:,.1f} MB in {bar.parse_seconds:.1f} s{compiled}); "
        f"{seconds:.1f} s in all"
    )
