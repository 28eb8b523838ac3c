"""A task's malformed rows, counted by reason with the first ones kept (line, field, value,
reason), its kept rows whose lists were cut at max_length, and the one-line errors that stop a
run: a malformed row under --strict, a value its part cannot store; each names the file and line
(a Parquet file's row)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardrec.dataloader.spec.feature_spec import ListColumn
from shardrec.tools.preprocess.parse.criteo_text import REASONS
from shardrec.tools.preprocess.parse.text_parser import Chunk
from shardrec.tools.preprocess.parts.part_columns import NonFiniteDense
from shardrec.tools.preprocess.tasks.task import STAGED, Task, TaskOptions
from shardrec.tools.preprocess.tasks.task_markers import TaskResult
from shardrec.tools.preprocess.text.lines import count_range_lines, header_end

MAX_REPORTED = 5


@dataclass(frozen=True)
class BadRow:
    """A malformed row as a message names it."""

    path: str
    where: str
    """`file:line`, or a Parquet file's `file: row N` (from 1)."""
    field: str
    """The column's name, or "row" for a reason of the whole row."""
    value: str
    """As shown (criteo_text.show_value), with what describing it added."""
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.field}: {self.value} ({self.reason})"


class MalformedRowError(ValueError):
    """A malformed row under --strict; the message is `file:line: field: value (reason)` and
    `row` says which (a worker's error keeps it: pickled with its __dict__)."""

    def __init__(self, message: str, row: BadRow | None = None) -> None:
        super().__init__(message)
        self.row = row


class UnstorableValueError(ValueError):
    """A row's value that its part cannot store (a dense value past its dtype, a raw id that is
    the empty field's own value): a refusal of the input, as a malformed row under --strict is."""


def _absolute_line(task: Task, local: int) -> int:
    """1-based physical line number in the file (a header counts as line 1); a Parquet file's
    row number, from 1."""
    first = task.first_line
    if first < 0:
        begin = header_end(Path(task.path)) if task.header else 0
        first = count_range_lines(Path(task.path), begin, task.start)
    return first + local + 1 + int(task.header)


def note_bad_rows(
    task: Task,
    describe: Callable[[int], tuple[str, str]],
    chunk: Chunk,
    line0: int,
    result: TaskResult,
    strict: bool,
) -> None:
    """Count a piece's malformed rows by reason and keep the first ones as (line, field, value,
    reason); describe(row): the field and value of a malformed row of the piece."""
    bad = np.flatnonzero(~chunk.ok)
    if not len(bad):
        return
    codes, counts = np.unique(chunk.reason[bad], return_counts=True)
    for c, n in zip(codes, counts):
        result.skipped[REASONS[c]] = result.skipped.get(REASONS[c], 0) + int(n)
    if task.default_split == STAGED:
        result.bad_lines.extend((line0 + bad).tolist())
    for row in bad[: max(0, MAX_REPORTED - len(result.errors))]:
        name, value = describe(int(row))
        result.errors.append([line0 + int(row), name, value, REASONS[chunk.reason[row]]])
    if strict:
        local, name, value, reason = result.errors[0]
        row = BadRow(task.path, place_of(task, local), name, value, reason)
        raise MalformedRowError(str(row), row)


def note_lists_cut(
    chunk: Chunk, idx: np.ndarray, opts: TaskOptions, into: dict[str, list[int]]
) -> None:
    """Count, per list column, the rows `idx` (kept) whose list held more values than its
    max_length, and the values so left out (a spec's list columns: chunk.list_total), into
    [max_length, rows, values] (TaskResult.lists_cut). A side sequence is cut with its primary,
    at its primary's max_length (its own is not read): the primary's count says it."""
    total = getattr(chunk, "list_total", None)
    if total is None or not total.shape[1]:
        return
    columns = [c for c in opts.parser.program.spec.sparse if isinstance(c, ListColumn)]
    for c, column in enumerate(columns):
        if getattr(column, "side_of", ""):
            continue
        over = total[idx, c] - column.max_length
        cut = over > 0
        if cut.any():
            counts = into.setdefault(column.name, [column.max_length, 0, 0])
            counts[1] += int(np.count_nonzero(cut))
            counts[2] += int(over[cut].sum())


@dataclass
class ListsCut:
    """A list column's rows that held more than max_length values, and the values they left out
    (the first max_length kept; a sequence's last)."""

    max_length: int
    rows: int
    values: int


def lists_cut(counts: Iterable[dict[str, list[int]]]) -> dict[str, ListsCut]:
    """Counts of note_lists_cut summed (each task's: the same for any number of workers, and for
    a resumed run, whose finished tasks' markers keep them)."""
    out: dict[str, ListsCut] = {}
    for count in counts:
        for name, (max_length, rows, values) in count.items():
            cut = out.setdefault(name, ListsCut(max_length, 0, 0))
            cut.rows, cut.values = cut.rows + rows, cut.values + values
    return out


def list_cut_lines(cuts: dict[str, ListsCut], rows: int, then: str) -> list[str]:
    """One line per list column cut, its rows against `rows`, ending with `then` (what it means
    or what to do)."""
    return [
        f"{name}: {c.rows:,} rows ({_share(c.rows, rows)}) had more than max_length = "
        f"{c.max_length} values; {c.values:,} values left out ({then})"
        for name, c in cuts.items()
    ]


def _share(part: int, whole: int) -> str:
    """part / whole in whole percents, never 0% for some rows nor 100% for not all of them."""
    share = part / max(whole, 1)
    if 0 < share < 0.01:
        return "<1%"
    return ">99%" if 0.99 < share < 1 else f"{share:.0%}"


def place_of(task: Task, local: int) -> str:
    """`file:line` of a task's line (a Parquet file's: `file: row N`)."""
    line = _absolute_line(task, local)
    return f"{task.path}: row {line}" if task.parquet else f"{task.path}:{line}"


def non_finite_error(
    where: str, e: NonFiniteDense, opts: TaskOptions, scoring: bool = False
) -> UnstorableValueError:
    """The one line for a dense value its part cannot hold: `where` (file and line or row), column,
    value, and the fix (preprocessing); `scoring`: rows scored by a model, whose transform is
    fixed."""
    name = opts.parser.dense_names[e.column]
    if scoring:
        return UnstorableValueError(
            f"{where}: {name}: {e.value:g} is past what {opts.dense_dtype} holds with "
            "transform none, as the model's data was stored: the model would score infinity"
        )
    log = (
        f'give {name} transform = "signed-log1p" in the spec'
        if opts.parser.program
        else "preprocess with --dense-transform signed-log1p"
    )
    # As Python floats: numpy casts a Python float compared with a float32 to float32, which
    # printed an overflow warning above this line for a Parquet value past it (1e300).
    fits_float32 = abs(float(e.value)) <= float(np.finfo(np.float32).max)
    fix = f"drop --float16, or {log}" if opts.dense_dtype == "float16" and fits_float32 else log
    return UnstorableValueError(
        f"{where}: {name}: {e.value:g} is past what {opts.dense_dtype} holds with "
        f"transform none: it would train as infinity; {fix}"
    )
