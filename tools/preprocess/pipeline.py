"""`shardrec preprocess`: raw Criteo-shaped click logs -> a shardrec dataset directory.

The run is planned (inputs.plan_tasks), executed task by task in worker processes
(tasks.task_run.run_task), then finalized: task markers are gathered in task order, per-feature
statistics computed on the training split, and the manifest written last. Because the plan
never depends on `--workers` and the manifest holds no timings, the output is byte-identical
whatever the worker count, after a restart, and after `--part i/n` runs plus a final run.
"""

from __future__ import annotations

import json
import logging
from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Protocol

from shardrec.dataloader.util.locks import WORK_DIR
from shardrec.tools.preprocess import cpu_stages
from shardrec.tools.preprocess.gz_stream import stream_gzip
from shardrec.tools.preprocess.ids.vocab import (
    build_vocabularies,
    count_marker,
    release_freed_memory,
    run_dirs,
)
from shardrec.tools.preprocess.inputs import (
    RowsRefused,
    discover_inputs,
    plan_tasks,
    resolve_layout,
)
from shardrec.tools.preprocess.kept_rows import (
    PreprocessResult,
    check_rows_kept,
    first_bad_rows,
    partial_result,
    refusal_advice,
    summarize,
    write_manifest,
)
from shardrec.tools.preprocess.parse.parquet_schema import is_parquet
from shardrec.tools.preprocess.parse.text_parser import TextParser, choose_parser
from shardrec.tools.preprocess.pool import Pool, map_tasks, shared_pool
from shardrec.tools.preprocess.settings import (
    PreprocessConfig,
    check_fingerprint,
    mark_refused,
    remove_temporaries,
)
from shardrec.tools.preprocess.tasks.bad_rows import MalformedRowError, UnstorableValueError
from shardrec.tools.preprocess.tasks.task import Task, TaskOptions
from shardrec.tools.preprocess.tasks.task_markers import read_marker, wait_for_writes
from shardrec.tools.preprocess.tasks.task_run import process_setup, run_task_safely
from shardrec.tools.preprocess.tasks.task_text import InputError
from shardrec.tools.preprocess.text.file_identity import changed_input
from shardrec.tools.preprocess.vocab_count import count_task

logger = logging.getLogger(__name__)


class Progress(Protocol):
    """Where a run reports progress (the CLI's progress bar)."""

    def start(self, total_bytes: int, label: str) -> None:
        """A phase ("count" in vocabulary mode, then "preprocess") is about to read total_bytes."""

    def advance(self, disk_bytes: int, text_bytes: int, lines: int) -> None:
        """One task finished: its input bytes on disk, text bytes and lines."""


def _build_vocab(
    cfg: PreprocessConfig,
    tasks: list[Task],
    opts: TaskOptions,
    progress: Progress | None,
    pool: Pool | None,
) -> TaskOptions:
    """Count (unless done), merge the counts into memory-mapped vocabularies (unless done)."""
    work, names = cfg.out / WORK_DIR, opts.names
    vocab_dir = work / "vocab"
    if not (vocab_dir / "vocab.json").is_file():
        _count(cfg, tasks, opts, progress, pool)
        runs = run_dirs(work, [t.index for t in tasks if t.holds_train_lines])
        with cpu_stages.stage(cpu_stages.MERGE):
            info = build_vocabularies(
                runs, names, cfg.min_count, opts.vocab_memory_bytes, vocab_dir
            )
        logger.info(
            "vocabularies merged from %d count runs in %d value ranges",
            len(runs),
            sum(info["merge_ranges"]),
        )
    cards = tuple(json.loads((vocab_dir / "vocab.json").read_text())["cardinalities"])
    return replace(opts, cardinalities=cards, vocab_path=str(vocab_dir))


@dataclass(frozen=True)
class CheckedInputs:
    """What a run reads and how, found before anything is written under --out: a run refused here
    (a missing input, a spec its files do not match, a --raw-ids name no feature has) leaves no
    folder, and the corrected command does not find one holding a run "with other settings"."""

    files: list[Path]
    layout: str
    parser: TextParser
    dense_transform: str
    cardinalities: tuple[int, ...]


def _no_parquet(files: list[Path], cfg: PreprocessConfig) -> None:
    """ValueError for a Parquet file where text is read: its bytes parsed as lines made every row
    malformed (too_few_fields), naming no Parquet."""
    found = next((f for f in files if is_parquet(f)), None)
    if found is None:
        return
    reads = (
        f"the spec {cfg.spec_file or ''} reads {cfg.spec.format.kind.upper()} text"
        if cfg.spec is not None
        else "without --spec, preprocess reads Criteo's text"
    )
    raise ValueError(
        f"{found}: a Parquet file, and {reads}; a Parquet file is read by a spec of kind = "
        f'"parquet": `shardrec spec infer {found} --label COLUMN --out spec.toml` proposes one, '
        "then preprocess --spec spec.toml"
    )


def check_inputs(cfg: PreprocessConfig) -> CheckedInputs:
    """The inputs, their layout, the parser (the spec checked against the inputs' header) and the
    tables' rows; InputError, DatasetError, ValueError or OSError naming what is wrong."""
    files = discover_inputs(cfg.inputs, cfg.input_names)
    if not cfg.parquet:
        _no_parquet(files, cfg)
    layout = resolve_layout(cfg.layout, files)
    parser, dense_transform = choose_parser(
        cfg.spec, cfg.spec_file, cfg.schema, cfg.dense_transform, files
    )
    return CheckedInputs(
        files, layout, parser, dense_transform, cfg.cardinalities(parser.sparse_names)
    )


def run_preprocess(
    cfg: PreprocessConfig, progress: Progress | None = None, inputs: CheckedInputs | None = None
) -> PreprocessResult:
    """Plan, run unfinished tasks, and (unless other parts are unfinished) write the manifest;
    `inputs`: check_inputs(cfg) where the caller ran it already (before taking --out's lock)."""
    before = cpu_stages.totals()
    process_setup()
    inputs = inputs or check_inputs(cfg)
    if not cfg.parquet:  # Parquet's columns are not parsed as text
        inputs.parser.warm_up()  # before any progress bar: its rate is parsing's, not the compile's
    cfg.out.mkdir(parents=True, exist_ok=True)
    recorded = cfg.fingerprint(inputs.files, for_rerun=True)
    check_fingerprint(cfg.out, recorded, part=cfg.part is not None)
    try:
        result = _run(cfg, progress, inputs, recorded["inputs"])
    except (MalformedRowError, RowsRefused, InputError, UnstorableValueError) as e:
        if cfg.part is None:  # under --part, other machines' tasks are in --out
            mark_refused(cfg.out)
        if not isinstance(e, MalformedRowError) or e.row is None:
            raise
        # --strict: what to do about the row, as a refusal of too many says
        skip = "leave out --strict to skip such rows (up to --max-skipped-fraction of them)"
        said = refusal_advice(inputs.parser, cfg.spec, e.row, {e.row.reason: 1}, skip)
        raise MalformedRowError(f"{e}{said}", e.row) from None
    result.cpu_s_by_stage = {
        k: round(v - before.get(k, 0.0), 3) for k, v in cpu_stages.totals().items()
    }
    return result


def _run(
    cfg: PreprocessConfig, progress: Progress | None, inputs: CheckedInputs, identities: list[dict]
) -> PreprocessResult:
    """The run's tasks, then its manifest; `identities`: the inputs as the run record holds
    them (file_identity), which they must still be once every task has read them."""
    files, layout, parser = inputs.files, inputs.layout, inputs.parser
    if cfg.part is None:
        # With --part, other machines may be writing into the same directory right now.
        remove_temporaries(cfg.out)
    opts = TaskOptions(
        str(cfg.out),
        parser,
        chunk_bytes=int(cfg.chunk_mb * (1 << 20)),
        cardinalities=inputs.cardinalities,
        dense_transform=inputs.dense_transform,
        dense_dtype=cfg.dense_dtype,
        strict=cfg.strict,
        vocab_memory_bytes=int(cfg.vocab_memory_mb * (1 << 20)),
    )
    # A large .gz file is decoded once, its tasks run as it goes; not in vocabulary mode (ids need
    # the vocabularies first) nor under --part (each machine runs its own share of a planned cut).
    streams = cfg.min_count <= 0 and cfg.part is None
    streamed: list[int] = []  # tasks that stream_gzip ran
    stream = (
        partial(stream_gzip, opts=opts, workers=cfg.workers, progress=progress, ran=streamed)
        if streams
        else None
    )
    with cpu_stages.stage(
        cpu_stages.PLAN
    ):  # a streamed .gz file's tasks run inside: their stages pause this one
        tasks = plan_tasks(
            files, layout, cfg.val_half, opts.chunk_bytes, cfg.header, cfg.out / WORK_DIR, stream,
            cfg.parquet, parser.row_end, parser.blank,
        )  # fmt: skip
    mine = [t for t in tasks if cfg.part is None or t.index % cfg.part[1] == cfg.part[0]]
    # Vocabulary mode's two passes (count, then preprocess) share one pool of workers.
    with shared_pool(cfg.workers, len(tasks)) if cfg.min_count > 0 else nullcontext() as pool:
        if cfg.min_count > 0:
            if cfg.part is not None and not _all_counted(cfg.out, tasks):
                _count(cfg, mine, opts, progress, pool)
                if not _all_counted(cfg.out, tasks):
                    return partial_result(cfg.out, tasks, 0)
            opts = _build_vocab(cfg, tasks, opts, progress, pool)
        done = {
            t.index: read_marker(cfg.out, t.index) for t in mine
        }  # torn or with parts gone: redone
        todo = [t for t in mine if done[t.index] is None]
        logger.info(
            "%d of %d tasks to run (%d already done)", len(todo), len(tasks), len(tasks) - len(todo)
        )
        _run_tasks(cfg, todo, opts, progress, pool)
    results = [done.get(t.index) or read_marker(cfg.out, t.index) for t in tasks]
    if any(r is None for r in results):
        return partial_result(cfg.out, tasks, len(todo) + len(streamed))
    _check_unchanged(cfg, files, identities)
    errors = first_bad_rows(tasks, results)
    check_rows_kept(
        cfg, layout, files, tasks, results, errors, partial(refusal_advice, parser, cfg.spec)
    )
    with cpu_stages.stage(cpu_stages.STATS):
        manifest = write_manifest(cfg, layout, tasks, results, opts)
    return summarize(manifest, tasks, results, len(todo) + len(streamed))


def _check_unchanged(cfg: PreprocessConfig, files: list[Path], identities: list[dict]) -> None:
    """InputError (a run refused for its input: the same command starts over) where an input was
    replaced or changed while the tasks read it (a sync, `cp -p` over it): the tasks before read
    the old bytes, those after the new, and the dataset would mix them without a word."""
    changed = changed_input(files, identities)
    if not changed:
        return
    again = (
        "run the same command again: it starts over on the file as it is now"
        if cfg.part is None
        else f"remove {cfg.out}, then start the --part runs again"
    )
    raise InputError(
        f"{cfg.out}: an input changed while this run read it ({changed}): its parts would mix "
        f"the file's bytes before and after, so no dataset is written; {again}"
    )


def _run_tasks(
    cfg: PreprocessConfig,
    todo: list[Task],
    opts: TaskOptions,
    progress: Progress | None,
    pool: Pool | None,
) -> None:
    failures = []
    if progress and todo:  # none after a rerun, or after a streamed .gz file (its own bar)
        progress.start(sum(_disk_bytes(t) for t in todo), "preprocess")
    # In one process, a task's fsyncs overlap the next task's parsing (see run_task).
    in_process = cfg.workers == 1 or len(todo) <= 1
    run = partial(run_task_safely, background_sync=in_process)
    try:
        for t, (res, cpu) in map_tasks(run, todo, opts, cfg.workers, pool):
            cpu_stages.add(cpu)
            if isinstance(res, str):
                failures.append(res)
            elif progress:
                progress.advance(_disk_bytes(t), res.bytes, res.lines)
    finally:
        wait_for_writes()
    if failures:
        raise InputError(
            "; ".join(failures) + " (output of the other files is kept; rerun to finish)"
        )


def _disk_bytes(task: Task) -> int:
    if task.parquet:
        return task.parquet_bytes
    return Path(task.path).stat().st_size if task.end < 0 else task.end - task.start


def _all_counted(out: Path, tasks: list[Task]) -> bool:
    return all(
        count_marker(out / WORK_DIR, t.index).is_file() for t in tasks if t.holds_train_lines
    )


def _count(
    cfg: PreprocessConfig,
    tasks: list[Task],
    opts: TaskOptions,
    progress: Progress | None,
    pool: Pool | None,
) -> None:
    """Vocabulary pass 1 over the tasks not counted yet; tasks without training lines (the
    val/test day) are not read: their rows never enter a vocabulary."""
    todo = [
        t
        for t in tasks
        if t.holds_train_lines and not count_marker(cfg.out / WORK_DIR, t.index).is_file()
    ]
    if progress and todo:
        progress.start(sum(_disk_bytes(t) for t in todo), "count")
    for t, (_, cpu) in map_tasks(_count_measured, todo, opts, cfg.workers, pool):
        cpu_stages.add(cpu)
        if progress:
            progress.advance(_disk_bytes(t), 0, 0)


def _count_measured(task: Task, opts: TaskOptions) -> tuple[Path, dict[str, float]]:
    marker = count_task(task, opts)
    # a kept worker goes on to map the vocabularies: no counting heap held meanwhile
    release_freed_memory()
    return marker, cpu_stages.take()
