"""`shardrec data multihot`: make a multi-hot dataset from a one-hot one, as MLPerf DLRMv2 does."""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from shardrec.dataloader.format.manifest import PART_SUFFIX, DatasetError, Manifest
from shardrec.dataloader.multihot.multihot_tables import (
    DISTRIBUTIONS,
    already_multi_hot,
    default_cache_dir,
)
from shardrec.tools.cli.common import fail, interrupted, print_json, write_error
from shardrec.tools.console import console
from shardrec.tools.preprocess.derived.multihot_dataset import (
    check_out,
    materialize_multihot,
    prepare_multihot,
)

CRITEO_1TB_ROWS = 4_373_472_329
"""What the printed projection is for: MLPerf DLRMv2 materialises Criteo 1TB's days."""
_READ_BLOCK = 1 << 24


@dataclass(frozen=True)
class _Run:
    """One timed materialisation: its manifest, wall seconds and CPU seconds (all threads)."""

    manifest: Manifest
    seconds: float
    cpu_seconds: float
    cpu_wait: float
    """Thread-seconds the workers were ready to run but waited for a CPU (others' load)."""


def _check_per_feature(
    flag: str, given: str, values: list[int], names: list[str], low: int, high: int | None
) -> None:
    """One value per sparse feature, each in [low, high): else one line naming the flag as typed,
    and the feature by name."""
    if len(values) != len(names):
        shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
        fail(
            f"{flag} {given}: {len(values)} values for {len(names)} sparse features ({shown}): "
            "give one per feature, in this order"
        )
    for name, v in zip(names, values):
        if v < low or (high is not None and v >= high):
            bound = f"at least {low}" if high is None else f"in [{low}, 2^31)"
            fail(f"{flag} {given}: {v} for {name} must be {bound}")


def _int_list(value: str, option: str) -> list[int]:
    try:
        return [int(v) for v in value.split(",")]
    except ValueError:
        fail(f"{option} {value!r}: expected comma-separated integers, e.g. 3,2,1")


def multihot(
    src: Annotated[
        Path, typer.Argument(help="One-hot dataset directory (from `shardrec preprocess`).")
    ],
    out: Annotated[Path, typer.Option(help="New dataset directory (must not exist, or be empty).")],
    sizes: Annotated[
        str,
        typer.Option(help="Ids per sample of each sparse feature, in manifest order: 3,2,1,..."),
    ],
    dist: Annotated[
        str, typer.Option(help="How the extra ids are drawn: uniform or pareto.")
    ] = "uniform",
    seed: Annotated[
        int, typer.Option(help="Seed of numpy's legacy generator (MLPerf's reference uses 0).")
    ] = 0,
    rows: Annotated[
        str | None,
        typer.Option(
            help="Table rows per feature: N1,N2,... (default: each feature's cardinality)."
        ),
    ] = None,
    cache: Annotated[
        Path | None,
        typer.Option(
            help=(
                "Folder for the index tables, drawn once and reused "
                "(default: shardrec/multihot under $XDG_CACHE_HOME, else ~/.cache)."
            )
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="Parts converted at once, on threads (the output is the same for any count).",
        ),
    ] = 1,
    compare_workers: Annotated[
        bool,
        typer.Option(
            "--compare-workers",
            help=(
                "First convert on one worker into a scratch copy beside OUT (deleted before the second run), "
                "then on --workers: print the speed-up, rows per CPU-second and both projections, check the "
                "bytes are the same, keep only OUT. Meaningful from ~8 M rows: start-up dominates small inputs."
            ),
        ),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Write a multi-hot copy of the one-hot dataset SRC, as MLPerf DLRMv2 does.

    Each one-hot id becomes its row of the feature's index table (row r: r, then size - 1 random
    ids), the MLPerf DLRMv2 reference's algorithm, so the ids equal the reference's for the same
    sizes, rows and seed."""
    if dist not in DISTRIBUTIONS:
        fail(f"--dist {dist!r} must be one of {', '.join(DISTRIBUTIONS)}")
    if compare_workers and workers < 2:
        fail(
            f"--compare-workers needs --workers of at least 2 to compare with one worker, got {workers}"
        )
    size_list = _int_list(sizes, "--sizes")
    row_list = _int_list(rows, "--rows") if rows is not None else None
    try:
        manifest = Manifest.load(src)
    except DatasetError as e:
        fail(str(e))
    if (multi := already_multi_hot(manifest, src)) is not None:
        why, source = multi
        fail(
            f"{why}: multi-hot ids are made from one-hot ones; give `data multihot` "
            + ("the one-hot dataset it was copied from" if source else "a one-hot dataset")
        )
    total = sum(s.rows for s in manifest.splits.values())
    _check_per_feature("--sizes", sizes, size_list, manifest.feature_names, 1, None)
    if row_list is not None:
        _check_per_feature("--rows", rows, row_list, manifest.feature_names, 1, 2**31)
    kwargs = dict(
        rows=row_list,
        dist=dist,
        seed=seed,
        cache_dir=cache if cache is not None else default_cache_dir(),
    )
    setup = time.perf_counter()
    try:
        check_out(src, out)
        # Drawn (first time) and compiled kernels loaded outside the clocks: in a comparison the
        # first run paid for both, which made one worker look slower than it is.
        kwargs["tables"] = prepare_multihot(src, size_list, **kwargs)
    except (ValueError, DatasetError) as e:
        fail(str(e))
    if compare_workers:
        _read_through(src)  # both runs read the source from the page cache, not the first from disk
    setup = time.perf_counter() - setup
    load_before = os.getloadavg()
    one_worker = (
        _one_worker(src, out, size_list, total, json_out, kwargs) if compare_workers else None
    )
    run = _timed(src, out, size_list, total, workers, json_out, kwargs)
    if one_worker is not None and (
        one_worker.manifest.splits,
        one_worker.manifest.sparse_features,
    ) != (
        run.manifest.splits,
        run.manifest.sparse_features,
    ):
        fail(
            f"{out}: {workers} workers wrote other bytes than one worker (checksums or statistics differ)"
        )
    machine = {
        "cores": len(os.sched_getaffinity(0)),
        "load_average": {"before": load_before, "after": os.getloadavg()},
    }
    _report(total, run, workers, one_worker, setup, machine, out, json_out)


def _one_worker(
    src: Path, out: Path, sizes: list[int], total: int, quiet: bool, kwargs: dict
) -> _Run:
    """The comparison's one-worker run, into a scratch copy beside `out` deleted before the
    second run starts: one copy of the output on disk at a time."""
    scratch = out.with_name(f".{out.name}.one-worker-{os.getpid()}")
    try:
        return _timed(src, scratch, sizes, total, 1, quiet, kwargs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _read_through(src: Path) -> None:
    """Read every part of the dataset once, so that it sits in the page cache (if it fits)."""
    for path in sorted(src.rglob(f"*{PART_SUFFIX}")):
        with open(path, "rb") as f:
            while f.read(_READ_BLOCK):
                pass


def _timed(
    src: Path, out: Path, sizes: list[int], total: int, workers: int, quiet: bool, kwargs: dict
) -> _Run:
    """One materialisation with its progress bar."""
    start, cpu = time.perf_counter(), time.process_time()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,} rows {task.fields[rate]}"),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=console, disable=quiet) as progress:
            task = progress.add_task(
                f"multi-hot, {workers} worker(s)", total=max(total, 1), rate=""
            )

            waits: dict[int, float] = {}

            def advance(n: int) -> None:
                waits.update(_run_queue_waits())  # after each part, while the workers still live
                done = progress.tasks[0].completed + n
                progress.update(
                    task, advance=n, rate=f"{done / max(time.perf_counter() - start, 1e-9):,.0f}/s"
                )

            manifest = materialize_multihot(
                src, out, sizes, on_rows=advance, workers=workers, **kwargs
            )
    except (ValueError, DatasetError) as e:
        fail(str(e))
    except OSError as e:  # no space or permission where --out goes, a file where a folder would
        fail(write_error(out, "multi-hot copy", e) + "; nothing written")
    except KeyboardInterrupt:
        interrupted(
            f"{out}: nothing written (parts are converted in a temporary folder, now removed); the "
            "index tables drawn are kept; rerun the same command"
        )
    return _Run(
        manifest, time.perf_counter() - start, time.process_time() - cpu, sum(waits.values())
    )


def _run_queue_waits() -> dict[int, float]:
    """Seconds each conversion worker thread has waited in the run queue so far (Linux
    schedstat; empty where there is none): what a loaded machine costs a timing."""
    waits = {}
    for thread in threading.enumerate():
        if thread.name.startswith("shardrec-multihot_") and thread.native_id is not None:
            try:
                with open(f"/proc/self/task/{thread.native_id}/schedstat") as f:
                    waits[thread.native_id] = int(f.read().split()[1]) / 1e9
            except (OSError, ValueError, IndexError):
                pass
    return waits


def _report(
    total: int,
    run: _Run,
    workers: int,
    one_worker: _Run | None,
    setup: float,
    machine: dict,
    out: Path,
    json_out: bool,
) -> None:
    seconds, manifest, spec = run.seconds, run.manifest, run.manifest.options["multihot"]
    rate = total / max(seconds, 1e-9)
    # A projection, not a measurement: this run's rate held over Criteo 1TB's rows.
    hours = CRITEO_1TB_ROWS / rate / 3600
    # The bytes written per row say whether the disk or the CPU bounds the rate (each row is
    # written once and synced: a disk of D MB/s caps it at D / bytes-a-row).
    written = sum(part.bytes for split in manifest.splits.values() for part in split.parts)
    per_row = written / max(total, 1)
    result = {"out": str(out), "samples": total, "seconds": round(seconds, 3), "workers": workers,
              "rows_per_s": round(rate, 1), "criteo_1tb_hours": round(hours, 2),
              "cpu_seconds": round(run.cpu_seconds, 3), "rows_per_cpu_s": round(total / max(run.cpu_seconds, 1e-9), 1),
              "cpu_wait_seconds": round(run.cpu_wait, 3),
              "setup_seconds": round(setup, 3), **machine,
              "bytes_written": written, "mb_per_s_written": round(written / max(seconds, 1e-9) / 1e6, 1),
              "multihot": spec}  # fmt: skip
    if one_worker is not None:
        one_rate = total / max(one_worker.seconds, 1e-9)
        result["one_worker"] = {"seconds": round(one_worker.seconds, 3), "rows_per_s": round(one_rate, 1),
                                "cpu_seconds": round(one_worker.cpu_seconds, 3),
                                "cpu_wait_seconds": round(one_worker.cpu_wait, 3),
                                "rows_per_cpu_s": round(total / max(one_worker.cpu_seconds, 1e-9), 1),
                                "criteo_1tb_hours": round(CRITEO_1TB_ROWS / one_rate / 3600, 2),
                                "speedup": round(one_worker.seconds / max(seconds, 1e-9), 3),
                                "same_bytes": True}  # fmt: skip
    if json_out:
        print_json(result)
        return
    console.print(
        f"wrote {total:,} rows with multi-hot sizes {spec['sizes']} ({spec['dist']}, seed {spec['seed']}) to {out} "
        f"in {seconds:.1f} s on {workers} worker(s): {rate:,.0f} rows/s, {result['mb_per_s_written']:,.0f} MB/s "
        f"written ({per_row:,.0f} bytes a row); Criteo 1TB's {CRITEO_1TB_ROWS / 1e9:.2f} B rows at this rate: "
        f"{hours:,.1f} h (a projection; {CRITEO_1TB_ROWS * per_row / 1e12:,.1f} TB to write)",
        highlight=False,
    )
    load = " / ".join(
        " ".join(f"{v:.2f}" for v in machine["load_average"][k]) for k in ("before", "after")
    )
    per_cpu = f"{result['rows_per_cpu_s']:,.0f}"
    cpu = f"rows per CPU-second: {per_cpu} on {workers} worker(s)"
    waited = f"{run.cpu_wait:.1f} thread-s on {workers} worker(s)"
    if one_worker is not None:
        w = result["one_worker"]
        console.print(
            f"{workers} workers: {w['speedup']:.2f}x one worker ({w['rows_per_s']:,.0f} rows/s, "
            f"Criteo 1TB {w['criteo_1tb_hours']:,.1f} h), same bytes",
            highlight=False,
        )
        cpu = (
            f"rows per CPU-second: {w['rows_per_cpu_s']:,.0f} on one worker, {per_cpu} on {workers}"
        )
        waited = f"{one_worker.cpu_wait:.1f} thread-s on one worker, {waited}"
    console.print(cpu, highlight=False)
    console.print(
        f"{machine['cores']} cores, load average (1, 5, 15 min) before / after: {load}; workers ready but waiting "
        f"for a CPU: {waited}; {setup:.1f} s of set-up before the clock(s): index tables, compiled kernels"
        f"{', source read' if one_worker is not None else ''}",
        highlight=False,
    )


def register(data_app: typer.Typer) -> None:
    data_app.command()(multihot)
