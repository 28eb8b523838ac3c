"""`shardrec bench scale`: make, preprocess, stream and train a Criteo-1TB-shaped dataset at a
fraction."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer

from shardrec.tools.bench.scale import scale_bench as bench_scale
from shardrec.tools.bench.scale import scale_report
from shardrec.tools.cli.bench.options import JsonFlag, show
from shardrec.tools.cli.common import fail, interrupted, sigterm_as_ctrl_c


def scale(
    fraction: Annotated[
        float, typer.Option(help="Share of Criteo 1TB's 4.37 B rows to make (0.01: ~43.7 M rows).")
    ] = 0.01,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            "--work-dir",
            help="Where data and runs go (kept; a rerun replaces them); default: a temporary directory, removed.",
        ),
    ] = None,
    steps: Annotated[
        int, typer.Option(min=1, help="Training steps before the resume, and as many after it.")
    ] = 200,
    batch: Annotated[
        int, typer.Option(min=2, help="Global batch size of the stream and training stages.")
    ] = 2048,
    train: Annotated[
        bool, typer.Option("--train/--no-train", help="Run the training and resume stages.")
    ] = True,
    workers: Annotated[
        int | None,
        typer.Option(min=1, help="Processes that synthesise and preprocess; default: every core."),
    ] = None,
    ranks: Annotated[
        int, typer.Option(min=1, help="Rank processes that stream and train.")
    ] = bench_scale.TRAIN_RANKS,
    json_out: JsonFlag = False,
) -> None:
    """Make, preprocess (hashing and vocabulary), stream and train a Criteo-1TB-shaped dataset at a
    fraction."""
    if not 0 < fraction <= 1:
        fail(f"--fraction {fraction} must be in (0, 1]")
    progress = bench_scale.Progress()
    try:
        with sigterm_as_ctrl_c():  # a kill ends its stages' processes too, as Ctrl-C does
            result = _run(fraction, work_dir, steps, batch, train, workers, ranks, progress)
    except KeyboardInterrupt:  # its temporary folder is removed on the way out
        interrupted(_stopped(progress))
    show(result, json_out, scale_report.print_result)


def _run(
    fraction: float,
    work_dir: Path | None,
    steps: int,
    batch: int,
    train: bool,
    workers: int | None,
    ranks: int,
    progress: bench_scale.Progress,
) -> dict[str, Any]:
    work = work_dir or Path(tempfile.mkdtemp(prefix="shardrec-scale-"))
    try:
        bench_scale.prepare_work_dir(work)
        return bench_scale.run_scale(fraction, work, steps, batch, train, workers, ranks, progress)
    except (RuntimeError, ValueError) as e:
        fail(str(e))
    finally:
        if work_dir is None:
            shutil.rmtree(work, ignore_errors=True)


def _stopped(progress: bench_scale.Progress) -> str:
    """What a stopped run had measured (it prints no figures), and where it stopped."""
    done, running = ", ".join(progress.stages), progress.running
    if not done:
        return f"nothing measured (stopped in {running})" if running else "nothing measured"
    if running:
        return f"stopped in {running}, after measuring {done}"
    return f"stopped after measuring {done}, before printing its figures"


def register(bench_app: typer.Typer) -> None:
    bench_app.command("scale")(scale)
