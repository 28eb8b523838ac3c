"""What a run kept, checked before its manifest is written: no dataset is made from input that is
mostly not rows, from a file that is not rows of this format, or with a split whose lines were all
skipped; a split an input of a few rows leaves empty is a warning.

The usual way such a dataset came about: a directory or a list of inputs holding a file of
another format (a CSV beside Criteo's train.txt), taken as a day, its rows all skipped as
malformed, and the split it was meant to fill left empty; every count stayed under the overall
share of skipped rows allowed.
"""

from __future__ import annotations

import logging
from pathlib import Path

from shardrec.dataloader.format.manifest import SPLITS
from shardrec.tools.preprocess.settings import PreprocessConfig
from shardrec.tools.preprocess.task import Task
from shardrec.tools.preprocess.task_markers import TaskResult

logger = logging.getLogger(__name__)


def _skipped_share(
    where: str,
    lines: int,
    skipped: dict[str, int],
    allowed: float,
    errors: list[str],
    unit: str = "lines",
) -> str:
    """One line: the malformed lines (a Parquet file's: rows) of `where` against the share
    allowed, with the first one."""
    bad = sum(skipped.values())
    reasons = ", ".join(f"{k} {v:,}" for k, v in skipped.items())
    first = f"; first: {errors[0]}" if errors else ""
    if bad >= lines:
        return f"{where}: no rows kept, all {lines:,} {unit} are malformed ({reasons}){first}"
    return (
        f"{where}: {bad:,} of {lines:,} {unit} malformed ({bad / lines:.2%}: {reasons}), more than "
        f"the {allowed:g} allowed (--max-skipped-fraction){first}"
    )


def _add(into: dict[str, int], counts: dict[str, int]) -> None:
    for k, v in counts.items():
        into[k] = into.get(k, 0) + v


def check_rows_kept(
    cfg: PreprocessConfig,
    layout: str,
    tasks: list[Task],
    results: list[TaskResult],
    errors: list[str],
) -> None:
    """ValueError unless every input file and the whole input are mostly rows (skipped share at
    most cfg.max_skipped_fraction) and every split holds rows.

    errors: the first malformed rows as `file:line: field: value (reason)`.
    """
    lines = sum(r.lines for r in results)
    unit = "rows" if cfg.parquet else "lines"
    skipped: dict[str, int] = {}
    for r in results:
        _add(skipped, r.skipped)
    where = ", ".join(str(p) for p in cfg.inputs)
    if lines == 0:
        raise ValueError(
            f"{where}: no rows: the input holds no data lines{' after its header' if cfg.header else ''}"
        )
    # Each file first: a file of another format among many is a small share of the whole.
    files: dict[str, tuple[int, dict[str, int]]] = {}
    for t, r in zip(tasks, results):
        file_lines, file_skipped = files.setdefault(t.path, (0, {}))
        _add(file_skipped, r.skipped)
        files[t.path] = (file_lines + r.lines, file_skipped)
    for path, (file_lines, file_skipped) in files.items():
        file_bad = sum(file_skipped.values())
        if len(files) > 1 and file_lines and file_bad > cfg.max_skipped_fraction * file_lines:
            mine = [e for e in errors if e.startswith(f"{path}:")]
            raise ValueError(
                _skipped_share(path, file_lines, file_skipped, cfg.max_skipped_fraction, mine, unit)
            )
    bad = sum(skipped.values())
    if bad >= lines or bad > cfg.max_skipped_fraction * lines:
        raise ValueError(
            _skipped_share(where, lines, skipped, cfg.max_skipped_fraction, errors, unit)
        )
    _check_splits(cfg, layout, tasks, results, skipped)


def _lines_per_split(tasks: list[Task], results: list[TaskResult]) -> dict[str, int]:
    """The input lines each split's layout gives it (skipped ones included): a file cut by line
    number gives each range its lines, a training day all of its own."""
    lines: dict[str, int] = {}
    cut: set[str] = set()
    for t, r in zip(tasks, results):
        if not t.splits:
            lines[t.default_split] = lines.get(t.default_split, 0) + r.lines
        elif t.path not in cut:  # a file's ranges are the same on each of its tasks
            cut.add(t.path)
            for rng in t.splits:
                lines[rng.split] = lines.get(rng.split, 0) + max(0, rng.end - rng.begin)
    return lines


def _check_splits(
    cfg: PreprocessConfig,
    layout: str,
    tasks: list[Task],
    results: list[TaskResult],
    skipped: dict[str, int],
) -> None:
    """A split whose lines were all skipped (a day of another format) is an error; one that the
    layout gives no line (an input of a few rows) a warning: both with the counts."""
    kept: dict[str, int] = {}
    for r in results:
        _add(kept, r.kept)
    empty = [s for s in SPLITS if not kept.get(s)]
    if not empty:
        return
    lines = _lines_per_split(tasks, results)
    counts = ", ".join(f"{s} {kept.get(s, 0):,}" for s in SPLITS)
    bad = sum(skipped.values())
    names = [Path(p).name for p in dict.fromkeys(t.path for t in tasks)]
    if layout == "kaggle":
        how = (
            f"one file ({names[0]}) is cut into 7 pseudo-days, days 0-5 train and day 6 halved "
            "into val and test: it needs at least 8 lines"
        )
    else:
        how = (
            f"{len(names)} files ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}): every "
            f"file but the last ({names[-1]}) is a training day, the last is halved into val and "
            "test; name the input files on the command line in day order"
        )
    where = ", ".join(str(p) for p in cfg.inputs)
    skipped_all = [s for s in empty if lines.get(s, 0) > 0]
    if skipped_all:
        all_lines = ", ".join(f"{lines[s]:,} lines of {s}" for s in skipped_all)
        raise ValueError(
            f"{where}: split {' and '.join(skipped_all)} would hold no rows: its lines were all "
            f"skipped as malformed ({all_lines}; rows kept: {counts}; {bad:,} skipped); {how}"
        )
    logger.warning(
        "%s: split %s holds no rows, the input has too few lines (rows kept: %s); %s",
        where,
        " and ".join(empty),
        counts,
        how,
    )
