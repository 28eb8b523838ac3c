"""The run's metrics.jsonl: appended by rank 0 while it trains, read by report, runs and the
run's state (life/run_state.py)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from shardrec.dataloader.util.files import write_error
from shardrec.trainer.rundir import names


class MetricsWriter:
    """Appends one JSON object per line to RUN/metrics.jsonl (and TensorBoard when installed).

    Each line is flushed and fsynced, so a killed run keeps every line written before the kill.
    TensorBoard tags are KIND/KEY, or KIND/SPLIT/KEY for a record of one split (eval/val/auc,
    eval/test/auc), so that two splits evaluated at one step are two curves, not one zig-zag.
    resumed_at: the step a resumed run restarts from; TensorBoard hides the events a killed
    run wrote after it (SummaryWriter's purge_step), as the resumed run writes those steps again.
    stretch, data: the run's current stretch (`--continue-on`) and its data's path, whose
    TensorBoard events go to a run folder of their own (tensorboard_dir).
    """

    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = True,
        resumed_at: int | None = None,
        stretch: int = 0,
        data: str = "",
    ) -> None:
        self.path = run_dir / names.METRICS
        run_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a")
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is optional
                pass
            else:
                purge = None if resumed_at is None else resumed_at + 1
                where = tensorboard_dir(run_dir, stretch, data)
                self._tb = SummaryWriter(str(where), purge_step=purge)

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True) + "\n"
        try:
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as e:  # a full disk: one line naming the file, not a traceback
            raise write_error(e, self.path, len(line.encode())) from e
        if self._tb is not None and "step" in record:
            prefix = record.get("kind", "train")
            if "split" in record:
                prefix = f"{prefix}/{record['split']}"
            for key, value in record.items():
                if (
                    isinstance(value, (int, float))
                    and key != "step"
                    and not isinstance(value, bool)
                ):
                    self._tb.add_scalar(f"{prefix}/{key}", value, record["step"])

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def tensorboard_dir(run_dir: Path, stretch: int, data: str) -> Path:
    """Where a stretch's TensorBoard events go: RUN/tensorboard for the first (every run that
    never went on), RUN/tensorboard/stretch-N-DATA for stretch N (DATA: its data folder's last two
    parts, `stretch-1-days-1` for days/1). Each stretch evaluates its own data's splits: in one
    folder, day 0's test AUC and day 1's were one line per tag, read as one split's trend;
    TensorBoard draws each run folder as a line of its own, as `shardrec report` draws each
    stretch's curve. The name is the same from the path as given (`--continue-on days/1`) and as
    a resume reads it (absolute)."""
    root = Path(run_dir) / names.TENSORBOARD
    if stretch == 0:
        return root
    parts = Path(data).resolve().parts[-2:]
    return root / "-".join(["stretch", str(stretch), *(p for p in parts if p != "/")])


def append_record(run_dir: Path, record: dict[str, Any]) -> None:
    """Append one record to RUN/metrics.jsonl from outside the ranks (the launcher, after they
    ended): on a line of its own even where a killed rank 0 left a torn last line."""
    path = Path(run_dir) / names.METRICS
    line = json.dumps(record, sort_keys=True) + "\n"
    try:
        with open(path, "ab+") as f:
            f.seek(0, os.SEEK_END)
            if f.tell():
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = "\n" + line
            f.write(line.encode())
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise write_error(e, path, len(line.encode())) from e


@dataclass(frozen=True)
class MetricsLog:
    """RUN/metrics.jsonl as read: its records and the line numbers of torn lines skipped."""

    path: Path
    records: list[dict[str, Any]]
    skipped: list[int]


def load_metrics(run_dir: Path, *, torn: Literal["error", "last", "any"] = "error") -> MetricsLog:
    """Read RUN/metrics.jsonl; ValueError names the run directory when it has none.

    torn: what a line that is not a JSON object means. "error": ValueError naming file:line.
    "last": a torn last line (a run killed while appending it) is skipped, any other is an
    error. "any": every such line is skipped (status displays that must not fail on a record).
    """
    path = Path(run_dir) / names.METRICS
    if not path.is_file():
        raise ValueError(names.no_run_file(run_dir, names.METRICS))
    lines = path.read_bytes().split(b"\n")
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records, skipped = [], []
    for i, line in enumerate(lines[: last + 1]):
        if not line.strip():
            continue
        try:
            record = json.loads(line)  # bytes that are not UTF-8 raise a ValueError too
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not an object")
        except ValueError as e:
            if torn == "any" or (torn == "last" and i == last):
                skipped.append(i + 1)
                continue
            hint = "; only a torn last line is skipped" if torn == "last" else ""
            raise ValueError(f"{path}:{i + 1}: not a JSON record ({e}){hint}") from None
        records.append(record)
    return MetricsLog(path, records, skipped)


def current_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`records` less those of steps a later invocation trains again: a `resume` (or a new
    `stretch`) record of step S drops every earlier record of a step past S, written by an attempt
    killed after its checkpoint of S. Its losses and evaluations were of a model that is gone, and
    the resumed run need not log the same steps (another train.log_interval) to replace them."""
    kept: list[dict[str, Any]] = []
    for record in records:
        step = record.get("step")
        if record.get("kind") in ("resume", "stretch") and isinstance(step, int):
            kept = [r for r in kept if not (isinstance(r.get("step"), int) and r["step"] > step)]
        kept.append(record)
    return kept


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of RUN/metrics.jsonl; ValueError names the file and line of a bad one."""
    return load_metrics(run_dir).records


def auc_text(metrics: dict[str, Any], digits: int = 4) -> str:
    """An evaluation's AUC as printed: its value, or why it has none (a split without rows, or
    whose labels are all one class: the rank statistic needs both)."""
    value = metrics["auc"]
    if value == value:
        return f"{value:.{digits}f}"
    return "n/a (no samples)" if not metrics.get("samples") else "n/a (labels of one class)"
