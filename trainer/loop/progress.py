"""Rank 0's view of training and evaluation: metrics.jsonl records, log lines, progress bars with
an ETA on a terminal (log lines print above a bar, never over it)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from shardrec.trainer.loop.steps import StepStats
from shardrec.trainer.rundir.checkpoint.parts import TrainProgress
from shardrec.trainer.rundir.metrics_log import MetricsWriter

logger = logging.getLogger(__name__)


class TrainReporter:
    """Accumulates the global loss reports between log lines, writes them, shows progress.

    Every rank has one (they all call it at the same steps); only rank 0's has a writer.
    """

    def __init__(
        self,
        writer: MetricsWriter | None,
        *,
        total_steps: int,
        first_step: int,
        log_interval: int,
        lr: Callable[[], float],
        unlogged: TrainProgress | None = None,
    ) -> None:
        """`unlogged`: the run's progress, whose loss since the last log line (restored from a
        checkpoint) the next line continues, and which keeps it for the next checkpoint."""
        self.writer = writer
        self.total = total_steps
        self.log_interval = log_interval
        self.lr = lr
        # Training time since the last log line, summed over segments: evaluations and checkpoints
        # between segments are not training and would lower samples/s.
        self._segment_start = time.perf_counter()
        self._seconds = 0.0
        self._samples = 0
        self._unlogged = unlogged if unlogged is not None else TrainProgress()
        self._loss = self._unlogged.unlogged_loss
        self._steps = self._unlogged.unlogged_steps
        self._bar: Any = None
        self._logs: list[tuple[logging.StreamHandler, Any]] = []
        if writer is not None and sys.stderr.isatty():
            from rich.progress import TextColumn

            self._bar = _progress(
                "train",
                TextColumn("{task.fields[rate]}"),
                TextColumn("loss {task.fields[loss]}"),
                transient=False,
            )
            self._task = self._bar.add_task(
                "train", total=total_steps, completed=first_step, rate="", loss="-"
            )
            self._bar.start()
            self._logs = _log_above(self._bar)

    def say(self, message: str, *args: Any) -> None:
        """A log line from rank 0 (above the progress bar when there is one)."""
        if self.writer is None:
            return
        if self._bar is not None:
            self._bar.console.print(message % args, highlight=False)
        else:
            logger.info(message, *args)

    def write(self, record: dict[str, Any]) -> None:
        if self.writer is not None:
            self.writer.write(record)

    def start_segment(self) -> None:
        """Training resumes (after an evaluation or a checkpoint): the clock restarts here."""
        self._segment_start = time.perf_counter()

    def on_report(self, stats: StepStats, epoch: int) -> None:
        now = time.perf_counter()
        self._seconds += now - self._segment_start
        self._segment_start = now
        self._samples += stats.samples
        self._loss += stats.loss * stats.steps
        self._steps += stats.steps
        if stats.step % self.log_interval and stats.step != self.total:
            self._unlogged.unlogged_loss, self._unlogged.unlogged_steps = self._loss, self._steps
            return
        rate = self._samples / max(self._seconds, 1e-9)
        loss = self._loss / max(self._steps, 1)
        self.write(
            {
                "kind": "train",
                "step": stats.step,
                "epoch": epoch,
                "loss": loss,
                "samples_per_s": rate,
                "lr": self.lr(),
            }
        )
        if self._bar is not None:
            self._bar.update(
                self._task, completed=stats.step, rate=f"{rate:,.0f} samples/s", loss=f"{loss:.5f}"
            )
        else:
            self.say("step %d/%d loss %.5f %.0f samples/s", stats.step, self.total, loss, rate)
        self._seconds, self._samples, self._loss, self._steps = 0.0, 0, 0.0, 0
        self._unlogged.unlogged_loss, self._unlogged.unlogged_steps = 0.0, 0

    def close(self) -> None:
        if self._bar is not None:
            _restore_logs(self._logs)
            self._bar.stop()
        if self.writer is not None:
            self.writer.close()


def _progress(label: str, *columns: Any, transient: bool) -> Any:
    """A rich progress bar: label, bar, done/total, then `columns`, elapsed time and ETA."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        *columns,
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        transient=transient,
    )


def _log_above(bar: Any) -> list[tuple[logging.StreamHandler, Any]]:
    """Send the root logger's stderr records through the live bar (rich then prints them above it);
    returns what to restore. The handlers hold the stderr of before the bar started, which would
    write over the bar's line."""
    swapped = []
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream in (
            sys.__stderr__,
            bar.console.file,
        ):
            swapped.append((handler, handler.setStream(sys.stderr)))
    return swapped


def _restore_logs(swapped: list[tuple[logging.StreamHandler, Any]]) -> None:
    for handler, stream in swapped:
        handler.setStream(stream)


@contextmanager
def eval_progress(total: int, show: bool) -> Iterator[Callable[[int], None]]:
    """A bar with an ETA over `total` evaluation batches where `show` (rank 0) and stderr is a
    terminal; yields the function to call with the batches done."""
    if not show or not sys.stderr.isatty():
        yield lambda done: None
        return
    bar = _progress("eval", transient=True)
    task = bar.add_task("eval", total=total)
    with bar:
        logs = _log_above(bar)
        try:
            yield lambda done: bar.update(task, completed=done)
        finally:
            _restore_logs(logs)
