"""What a run kept: its manifest (write_manifest) and its summary (PreprocessResult), and the
checks made before the manifest is written: no dataset is made from input that is mostly not
rows, from a file that is not rows of this format, or with a split whose lines were all skipped;
a split an input of a few rows leaves empty is a warning.

The usual way such a dataset came about: a directory or a list of inputs holding a file of
another format (a CSV beside Criteo's train.txt), taken as a day, its rows all skipped as
malformed, and the split it was meant to fill left empty; every count stayed under the overall
share of skipped rows allowed.
"""

from __future__ import annotations

import logging
import math
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from importlib import metadata
from pathlib import Path

import numpy as np

from shardrec.dataloader.format.manifest import SPLITS, Manifest, PartInfo, SplitInfo
from shardrec.dataloader.spec.feature_spec import FeatureSpec
from shardrec.tools.preprocess.ids.id_maps import MISSING_ID, OOV_ID
from shardrec.tools.preprocess.infer.label_infer import spec_label_rule
from shardrec.tools.preprocess.inputs import RowsRefused
from shardrec.tools.preprocess.parse.parquet_schema import float_width
from shardrec.tools.preprocess.parse.text_parser import TextParser
from shardrec.tools.preprocess.parts.feature_stats import compute_feature_stats
from shardrec.tools.preprocess.settings import PreprocessConfig
from shardrec.tools.preprocess.tasks.bad_rows import BadRow, ListsCut, lists_cut
from shardrec.tools.preprocess.tasks.row_advice import row_advice
from shardrec.tools.preprocess.tasks.task import Task, TaskOptions
from shardrec.tools.preprocess.tasks.task_markers import TaskResult, read_marker

logger = logging.getLogger(__name__)


def _skipped_share(
    where: str,
    lines: int,
    skipped: dict[str, int],
    allowed: float,
    first: BadRow | None,
    unit: str = "lines",
    advice: str = "",
) -> str:
    """One line: the malformed lines (a Parquet file's: rows) of `where` against the share
    allowed, with the first one and `advice` (what to do about it)."""
    bad = sum(skipped.values())
    reasons = ", ".join(f"{k} {v:,}" for k, v in skipped.items())
    said = (f"; first: {first}" if first else "") + advice
    if bad >= lines:
        return f"{where}: no rows kept, all {lines:,} {unit} are malformed ({reasons}){said}"
    return (
        f"{where}: {bad:,} of {lines:,} {unit} malformed ({bad / lines:.2%}: {reasons}), more than "
        f"the {allowed:g} allowed (--max-skipped-fraction){said}"
    )


def least_fraction(bad: int, lines: int) -> float:
    """The smallest --max-skipped-fraction of two significant digits that accepts `bad` malformed
    lines of `lines` (check_rows_kept refuses more than the fraction times the lines)."""
    share = Fraction(bad, lines)
    scale = 10 ** max(0, 1 - math.floor(math.log10(share)))
    fraction = math.ceil(share * scale) / scale
    while bad > fraction * lines:  # float rounding of the product
        fraction += 1 / scale
    return min(fraction, 1.0)


def label_advice(parser: TextParser, path: Path) -> str:
    """For a refusal with bad_label rows: the key a spec's label column read as 0/1 (no mapping,
    no threshold) wants for the values of `path` (label_infer.spec_label_rule), or ""."""
    program = parser.program
    label = program.spec.label if program else None
    if label is None or label.mapping or label.threshold is not None:
        return ""
    rule = spec_label_rule(path, program)
    return (
        f"; the spec reads label column {label.name!r} as 0 and 1: give it {rule} (what "
        "`shardrec spec infer` proposes for its values)"
        if rule
        else ""
    )


def refusal_advice(
    parser: TextParser,
    spec: FeatureSpec | None,
    row: BadRow,
    skipped: dict[str, int],
    skip: str | None,
) -> str:
    """What a refusal adds for its first malformed row: where bad_label rows are among those
    counted (`skipped`), the rule a spec's 0/1 label wants for the file's values (label_advice);
    else what the row's field reads and what would read or `skip` it (row_advice). `skip` None:
    every line is malformed, and where they are so by their number of fields, most often a file
    of another format, which the row's value says (criteo_text.csv_hint), no edit is proposed."""
    said = label_advice(parser, Path(row.path)) if "bad_label" in skipped else ""
    if said or (skip is None and row.reason in ("too_few_fields", "too_many_fields")):
        return said
    parquet = parser.parquet is not None
    # The bound of an id read from floats is the file's float type's (float32: 2^24).
    bits = (
        float_width(Path(row.path), row.field) if parquet and row.reason == "bad_integer" else None
    )
    return row_advice(row.reason, row.field, spec, parquet, skip or "", bits or 64)


def _add(into: dict[str, int], counts: dict[str, int]) -> None:
    for k, v in counts.items():
        into[k] = into.get(k, 0) + v


def check_rows_kept(
    cfg: PreprocessConfig,
    layout: str,
    files: list[Path],
    tasks: list[Task],
    results: list[TaskResult],
    errors: list[BadRow],
    advice: Callable[[BadRow, dict[str, int], str | None], str] = lambda row, counts, skip: "",
) -> None:
    """RowsRefused unless every input file and the whole input are mostly rows (skipped share at
    most cfg.max_skipped_fraction) and every split holds rows.

    files: the input files in day order (a text file of a header alone has no task).
    errors: the first malformed rows.
    advice: what to do about the first malformed row of a refusal, given the reasons counted and
    how the run would skip such rows (None where no --max-skipped-fraction would: every line is
    malformed, most often a file of another format).
    """
    lines = sum(r.lines for r in results)
    unit = "rows" if cfg.parquet else "lines"
    skipped: dict[str, int] = {}
    for r in results:
        _add(skipped, r.skipped)
    where = ", ".join(str(p) for p in cfg.inputs)
    if lines == 0:
        raise RowsRefused(
            f"{where}: no rows: the input holds no data lines{' after its header' if cfg.header else ''}",
            final=True,
        )
    # Each file first: a file of another format among many is a small share of the whole.
    per_file: dict[str, tuple[int, dict[str, int]]] = {}
    for t, r in zip(tasks, results):
        file_lines, file_skipped = per_file.setdefault(t.path, (0, {}))
        _add(file_skipped, r.skipped)
        per_file[t.path] = (file_lines + r.lines, file_skipped)

    def refusal(place: str, n: int, counts: dict[str, int], rows: list[BadRow]) -> RowsRefused:
        final = sum(counts.values()) >= n
        first = rows[0] if rows else None
        # the share that accepts every file's and the whole input's malformed rows
        shares = [(sum(s.values()), m) for m, s in per_file.values() if m and len(per_file) > 1]
        most = max([(sum(skipped.values()), lines), *shares], key=lambda s: Fraction(*s))
        skip = f"skip such rows with --max-skipped-fraction {least_fraction(*most):g}"
        said = advice(first, counts, None if final else skip) if first else ""
        line = _skipped_share(place, n, counts, cfg.max_skipped_fraction, first, unit, said)
        return RowsRefused(line, final=final)

    for path, (file_lines, file_skipped) in per_file.items():
        if not file_lines and not cfg.parquet:  # a .gz of blank lines alone (plain: plan_tasks)
            after = " after its header" if cfg.header else ""
            raise RowsRefused(
                f"{path}: no data lines{after}, no rows: take it out of the inputs", final=True
            )
        file_bad = sum(file_skipped.values())
        if len(per_file) > 1 and file_lines and file_bad > cfg.max_skipped_fraction * file_lines:
            raise refusal(path, file_lines, file_skipped, [e for e in errors if e.path == path])
    bad = sum(skipped.values())
    if bad >= lines or bad > cfg.max_skipped_fraction * lines:
        raise refusal(where, lines, skipped, errors)
    _check_splits(cfg, layout, files, tasks, results, skipped)


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
    files: list[Path],
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
    names = [p.name for p in files]
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
        raise RowsRefused(
            f"{where}: split {' and '.join(skipped_all)} would hold no rows: its lines were all "
            f"skipped as malformed ({all_lines}; rows kept: {counts}; {bad:,} skipped); {how}",
            final=True,
        )
    unit = "rows" if cfg.parquet else "lines"
    last = _empty_last_file(layout, files, tasks, results)
    if last is not None:
        logger.warning(
            "%s: split %s holds no rows: the last file, %s, holds no %s, and of %d files the last "
            "is the one halved into val and test, every other a training day (rows kept: %s); "
            "remove it, or give it the rows of the day it stands for",
            where,
            " and ".join(empty),
            last,
            "data lines after its header" if cfg.header and not cfg.parquet else unit,
            len(names),
            counts,
        )
        return
    logger.warning(
        "%s: split %s holds no rows, the input has too few %s (rows kept: %s); %s",
        where,
        " and ".join(empty),
        unit,
        counts,
        how,
    )


def _empty_last_file(
    layout: str, files: list[Path], tasks: list[Task], results: list[TaskResult]
) -> str | None:
    """The name of the last of several day files where it holds no rows (a Parquet file of a
    schema alone, a text file of its header alone; an empty text file is refused before any task
    runs), else None. Counted over `files`: a header alone gives its file no task at all."""
    per_file = {str(f): 0 for f in files}
    for t, r in zip(tasks, results):
        per_file[t.path] += r.lines
    if layout == "kaggle" or len(per_file) < 2 or per_file[str(files[-1])]:
        return None
    return files[-1].name


@dataclass
class PreprocessResult:
    manifest: Manifest | None  # None after a --part run that left tasks for others
    lines: int
    bytes: int
    kept: dict[str, int]
    skipped: dict[str, int]
    errors: list[str]  # first malformed rows as `file:line: field: value (reason)`
    tasks_run: int
    tasks_total: int
    cpu_s_by_stage: dict[str, float] = field(
        default_factory=dict
    )  # this process and its workers (cpu_stages)
    lists_cut: dict[str, ListsCut] = field(default_factory=dict)
    """The list columns some kept row held more than max_length values of (bad_rows.lists_cut)."""


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "numpy": np.__version__}
    try:
        out["shardrec"] = metadata.version("shardrec")
    except metadata.PackageNotFoundError:
        pass
    return out


def partial_result(out: Path, tasks: list[Task], ran: int) -> PreprocessResult:
    results = [r for r in (read_marker(out, t.index) for t in tasks) if r is not None]
    return summarize(None, tasks, results, ran)


def write_manifest(
    cfg: PreprocessConfig,
    layout: str,
    tasks: list[Task],
    results: list[TaskResult],
    opts: TaskOptions,
) -> Manifest:
    splits: dict[str, SplitInfo] = {}
    skipped: dict[str, int] = {}
    for r in results:
        for p in r.parts:
            info = PartInfo(**p["part"])
            s = splits.setdefault(p["split"], SplitInfo())
            s.parts.append(info)
            s.rows += info.rows
        for k, v in r.skipped.items():
            skipped[k] = skipped.get(k, 0) + v
    splits = {s: splits.get(s, SplitInfo()) for s in SPLITS}
    features = opts.features()
    options = {
        **cfg.fingerprint([Path(t.path) for t in {t.path: t for t in tasks}.values()]),
        "layout": layout,
        "splits": _split_note(layout, cfg.val_half),
        "missing_id": MISSING_ID,
        "oov_id": OOV_ID if cfg.min_count > 0 else None,
        "hash": "1 + splitmix64(value) mod (cardinality - 1)" if cfg.min_count <= 0 else None,
    }
    dense = opts.parser.dense_names
    manifest = Manifest(dense, features, splits, cfg.dense_dtype, options, _versions(), skipped)
    manifest.lists_cut = {
        name: asdict(c) for name, c in lists_cut(r.lists_cut for r in results).items()
    }
    for name, stats in compute_feature_stats(cfg.out, manifest).items():
        manifest.feature(name).stats = stats
    manifest.save(cfg.out)
    return manifest


def _split_note(layout: str, val_half: str) -> dict:
    if layout == "kaggle":
        return {"days": 7, "train_days": "0-5", "halved_day": 6, "val_half": val_half}
    return {"train_days": "all files but the last", "halved_day": "last file", "val_half": val_half}


def first_bad_rows(tasks: list[Task], results: list[TaskResult], most: int = 10) -> list[BadRow]:
    """The first malformed rows the tasks kept (each task's first ones, in task order)."""
    rows: list[BadRow] = []
    by_index = {r.index: r for r in results}
    lines_before: dict[str, int] = {}
    for t in tasks:
        r = by_index.get(t.index)
        if r is None:
            continue
        before = t.first_line if t.first_line >= 0 else lines_before.get(t.path, 0)
        for local, name, value, reason in r.errors[: max(0, most - len(rows))]:
            where = (
                f"{t.path}: row {before + local + 1}"  # rows of a Parquet file, from 1
                if t.parquet
                else f"{t.path}:{before + local + 1 + int(t.header)}"
            )
            rows.append(BadRow(t.path, where, name, value, reason))
        lines_before[t.path] = before + r.lines
    return rows


def summarize(
    manifest: Manifest | None, tasks: list[Task], results: list[TaskResult], ran: int
) -> PreprocessResult:
    kept: dict[str, int] = {}
    skipped: dict[str, int] = {}
    for r in results:
        _add(kept, r.kept)
        _add(skipped, r.skipped)
    return PreprocessResult(
        manifest,
        sum(r.lines for r in results),
        sum(r.bytes for r in results),
        {s: kept[s] for s in SPLITS if s in kept},
        skipped,
        [str(row) for row in first_bad_rows(tasks, results)],
        ran,
        len(tasks),
        lists_cut=lists_cut(r.lists_cut for r in results),
    )
