"""`shardrec bench ...`: benchmarks that print ratios against a baseline measured in the same run.

Each command checks its flags, calls the benchmark's function in tools/bench and prints what
it returns (as a table, or as JSON with --json); the measuring is tools/bench's.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from shardrec.tools.bench import loader as bench_loader
from shardrec.tools.bench import plan as bench_plan
from shardrec.tools.bench import preprocess as bench_preprocess
from shardrec.tools.bench import scale as bench_scale
from shardrec.tools.bench import train as bench_train
from shardrec.tools.cli.common import console, fail, print_json

bench_app = typer.Typer(
    help="Benchmarks; each but `scale` prints its ratio against a baseline measured in the same run.",
    no_args_is_help=True,
)
JsonFlag = Annotated[bool, typer.Option("--json", help="Print the result as JSON.")]


def _show(result: dict, json_out: bool, printer: Callable[[dict], None]) -> None:
    """The benchmark's figures as JSON (--json) or as its own table."""
    if json_out:
        print_json(result)
    else:
        printer(result)


@bench_app.command("loader")
def loader(
    rows: Annotated[int, typer.Option(help="Rows of generated Criteo-shaped data.")] = 2_000_000,
    global_batch: Annotated[int, typer.Option("--global-batch", help="Samples per global batch.")] = 8192,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds per configuration; the best counts.")] = 5,
    max_batches: Annotated[int, typer.Option("--max-batches", help="Batches timed per run (at most one epoch).")] = 200,
    work_dir: Annotated[
        Path | None, typer.Option("--work-dir", help="Where to write the temporary data (default: system temp).")
    ] = None,
    parts: Annotated[
        int,
        typer.Option(
            help=(
                "Parts of the many-part run (default: a 1/100 Criteo-1TB-shaped dataset's, 24 days x 5 "
                "at the default 128 MiB chunk); one part is always run too."
            )
        ),
    ] = bench_loader.DEFAULT_PARTS,
    json_out: JsonFlag = False,
) -> None:
    """Loader rows/s as torchrec Batches on one thread, vs the memcpy roofline and torchrec's pipe."""
    if rows < 2 * global_batch or global_batch <= 0 or rounds <= 0 or max_batches <= 0:
        fail(
            "need --rows >= 2 x --global-batch and positive --rounds/--max-batches, "
            f"got {rows}, {global_batch}, {rounds}, {max_batches}"
        )
    if not 1 <= parts <= rows:
        fail(f"--parts must be in [1, --rows], got {parts}")
    if work_dir is not None and not work_dir.is_dir():
        fail(f"--work-dir {work_dir}: not a directory")
    result = bench_loader.run_bench(rows, global_batch, rounds, max_batches, work_dir, parts)
    _show(result, json_out, bench_loader.print_result)


@bench_app.command("preprocess")
def preprocess(
    size_gb: Annotated[
        float, typer.Option(help="Size of the generated TSV in GB (the goal is measured at >= 1).")
    ] = 1.0,
    workers: Annotated[int, typer.Option(help="Worker processes of the preprocess run.")] = 1,
    chunk_mb: Annotated[float, typer.Option(help="--chunk-mb of the preprocess run.")] = 128,
    work_dir: Annotated[
        Path | None, typer.Option(help="Keep the generated file here and reuse it (default: a temporary directory).")
    ] = None,
    like: Annotated[
        str,
        typer.Option(
            help="criteo (Criteo's TSV, the default parser), or movielens / avazu (synth --like's CSV with its "
            "inferred spec: string categoricals, quoting, lists)."
        ),
    ] = "criteo",
    json_out: JsonFlag = False,
) -> None:
    """Preprocess MB/s and peak RSS against a polars pipeline doing the same work (1 and all threads), same file."""
    from shardrec.tools.bench.polars_pipeline import INSTALL_HINT
    from shardrec.tools.bench.preprocess_like import print_like_report, run_like_bench

    if size_gb <= 0 or workers < 1:
        fail(f"--size-gb ({size_gb}) and --workers ({workers}) must be positive")
    if like not in ("criteo", "movielens", "avazu"):
        fail(f"--like {like!r} is not one of criteo, movielens, avazu")
    if bench_preprocess.polars_version() is None:
        fail(INSTALL_HINT)  # fail() prints text, not markup: the hint's [bench] stays
    tmp = None
    if work_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="shardrec-bench-")
        work_dir = Path(tmp.name)
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        if like == "criteo":
            result = bench_preprocess.run_bench(size_gb, workers, work_dir, chunk_mb)
        else:
            result = run_like_bench(like, size_gb, workers, work_dir, chunk_mb)
    except RuntimeError as e:
        fail(str(e))
    finally:
        if tmp is not None:
            tmp.cleanup()
    if like == "criteo":
        _show(result, json_out, bench_preprocess.print_report)
    else:
        _show(result, json_out, lambda r: print_like_report(r, console))


@bench_app.command("plan")
def plan(
    only: Annotated[str | None, typer.Option(help="Run only the cases whose name contains this text.")] = None,
    reserve: Annotated[
        float, typer.Option(help="Share of each rank's memory both planners keep free.")
    ] = bench_plan.RESERVE,
    json_out: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Cost of shardrec's plans vs torchrec's default planner under torchrec's estimators (ratio < 1: shardrec
    faster), both planners keeping the same memory free; shardrec's-cost-model ratios and both run times too."""
    cases = [c for c in bench_plan.CASES if only is None or only in c.name]
    if not cases:
        fail(f"--only {only!r} matches no case (cases: {', '.join(c.name for c in bench_plan.CASES)})")
    if not 0 <= reserve < 1:
        fail(f"--reserve must be in [0, 1) (got {reserve})")
    result = bench_plan.run_plan_bench(cases, reserve, show_progress=not json_out)
    _show(result, json_out, bench_plan.print_plan_table)


@bench_app.command("plan-reality")
def plan_reality(
    world_size: Annotated[int, typer.Option(help="Local gloo ranks.")] = 2,
    max_rows: Annotated[int, typer.Option(help="Rows per table (the demo caps ids at 50,000).")] = 50_000,
    dim: Annotated[int, typer.Option(help="Embedding width.")] = 16,
    global_batch_size: Annotated[int, typer.Option(help="Samples per step over all ranks.")] = 2048,
    steps: Annotated[int, typer.Option(help="Timed steps per plan.")] = 8,
    json_out: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Run a few distinct plans of the demo-sized model on CPU: does the cost model order them like the clock does,
    and do its memory estimates bound each rank's measured peak memory? Calibrates this machine first."""
    if world_size < 2 or global_batch_size % world_size:
        fail(f"--world-size must be >= 2 and divide --global-batch-size ({world_size}, {global_batch_size})")
    result, title = bench_plan.run_reality(world_size, max_rows, dim, global_batch_size, steps)
    _show(result, json_out, lambda r: bench_plan.print_reality_table(r, title))


@bench_app.command("train")
def train(
    model: Annotated[
        str, typer.Option(help="reference (the DLRM reference's shape) or demo (configs/demo.toml's).")
    ] = "reference",
    steps: Annotated[
        int, typer.Option(help="Steps per variant per round (a timed window); 0: 64 for reference, 256 for demo.")
    ] = 0,
    rounds: Annotated[int, typer.Option(help="Interleaved rounds; ratios are medians of same-round ratios.")] = 5,
    quality_steps: Annotated[
        int, typer.Option(help="Steps every side trains from fresh weights before its validation AUC.")
    ] = 125,
    nproc: Annotated[int, typer.Option(help="Ranks (on CUDA at most one per GPU).")] = 2,
    device: Annotated[str, typer.Option(help="cpu (gloo ranks) or cuda (NCCL, one GPU per rank).")] = "cpu",
    threads: Annotated[int, typer.Option(help="Torch threads per rank (both sides).")] = 1,
    json_out: JsonFlag = False,
) -> None:
    """Training samples/s: `shardrec train`'s path (fp32, bf16) vs stock torchrec, real loader vs in-memory batches."""
    if model not in bench_train.MODELS:
        fail(f"--model {model!r} is not one of {', '.join(bench_train.MODELS)}")
    steps = steps or bench_train.MODELS[model][5]
    if steps < 2 or rounds < 1 or nproc < 1 or threads < 1 or quality_steps < 1:
        fail("--steps must be >= 2, --rounds, --nproc, --threads and --quality-steps >= 1")
    try:
        bench_train.check_device(device, nproc)
        result = bench_train.run_bench(model, steps, rounds, quality_steps, nproc, device, threads)
    except (ValueError, RuntimeError) as e:
        fail(str(e))
    _show(result, json_out, bench_train.print_result)


@bench_app.command("scale")
def scale(
    fraction: Annotated[
        float, typer.Option(help="Share of Criteo 1TB's 4.37 B rows to make (0.01: ~43.7 M rows).")
    ] = 0.01,
    work_dir: Annotated[
        Path | None,
        typer.Option("--work-dir", help="Where data and runs go (kept); default: a temporary directory, removed."),
    ] = None,
    steps: Annotated[int, typer.Option(min=1, help="Training steps before the resume, and as many after it.")] = 200,
    batch: Annotated[int, typer.Option(min=2, help="Global batch size of the stream and training stages.")] = 2048,
    train: Annotated[bool, typer.Option("--train/--no-train", help="Run the training and resume stages.")] = True,
    json_out: JsonFlag = False,
) -> None:
    """Make, preprocess (hashing and vocabulary), stream and train a Criteo-1TB-shaped dataset at a fraction."""
    if not 0 < fraction <= 1:
        fail(f"--fraction {fraction} must be in (0, 1]")
    work = work_dir or Path(tempfile.mkdtemp(prefix="shardrec-scale-"))
    try:
        result = bench_scale.run_scale(fraction, work, steps, batch, train)
    except RuntimeError as e:
        fail(str(e))
    finally:
        if work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    _show(result, json_out, bench_scale.print_result)


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
