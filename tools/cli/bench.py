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

from shardrec.tools.bench import check as bench_check
from shardrec.tools.bench.loader import loader_bench as bench_loader
from shardrec.tools.bench.loader import multihot_bench as loader_multihot
from shardrec.tools.bench.loader import parts_bench as loader_parts
from shardrec.tools.bench.plan import plan_bench as bench_plan
from shardrec.tools.bench.preprocess import preprocess_bench as bench_preprocess
from shardrec.tools.bench.scale import scale_bench as bench_scale
from shardrec.tools.bench.train import train_bench as bench_train
from shardrec.tools.cli.common import fail, honour_ctrl_c, interrupted, print_json
from shardrec.tools.console import console

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


def _at_least(option: str, value: int, minimum: int, why: str = "") -> None:
    """One line naming `option` if `value` is under `minimum` (`why`: what the minimum means)."""
    if value < minimum:
        fail(f"{option} {value}: must be >= {minimum}{f' ({why})' if why else ''}")


def _given(ctx: typer.Context, *names: str) -> list[str]:
    """The options among `names` (parameter names) given on the command line, as flags."""
    given = [n for n in names if ctx.get_parameter_source(n).name != "DEFAULT"]
    return ["--" + n.replace("_", "-") for n in given]


def _refuse_unused(ctx: typer.Context, names: tuple[str, ...], context: str) -> None:
    """One line naming the first option given that does nothing in `context`."""
    for flag in _given(ctx, *names):
        fail(f"{flag} does nothing {context}: leave it out")


@bench_app.command("loader")
def loader(
    rows: Annotated[int, typer.Option(help="Rows of generated Criteo-shaped data.")] = 2_000_000,
    global_batch: Annotated[
        int, typer.Option("--global-batch", help="Samples per global batch.")
    ] = 8192,
    rounds: Annotated[
        int,
        typer.Option(
            help="Interleaved rounds after a warm-up; ratios are medians of same-round ones."
        ),
    ] = 7,
    max_batches: Annotated[
        int,
        typer.Option(
            "--max-batches",
            help="Batches per timed run (0: as many as take ~0.5 s, sized by each configuration's "
            "warm-up).",
        ),
    ] = 0,
    work_dir: Annotated[
        Path | None,
        typer.Option(
            "--work-dir", help="Where to write the temporary data (default: system temp)."
        ),
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
    part_rows: Annotated[
        int,
        typer.Option(
            "--part-rows",
            help=(
                "Instead: --parts parts of this many rows (one part's files hard-linked; Criteo 1TB: "
                "--parts 10000 --part-rows 450000), shuffled rows/s vs the one part, time to the first batch, "
                "memory, under ulimit -n 1024."
            ),
        ),
    ] = 0,
    multihot: Annotated[
        bool,
        typer.Option(
            "--multihot",
            help="Instead: samples/s per rank of DLRMv2's multi-hot ids made on the fly, against the one-hot loader.",
        ),
    ] = False,
    table_rows: Annotated[
        str,
        typer.Option(
            "--table-rows", help="With --multihot: index table rows to run, comma-separated."
        ),
    ] = "1000000,10000000",
    cache: Annotated[
        Path | None,
        typer.Option(
            help="With --multihot: folder of the index tables (default: the multi-hot cache)."
        ),
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Loader rows/s as torchrec Batches on one thread, vs the memcpy roofline and torchrec's
    pipe."""
    _at_least("--global-batch", global_batch, 1)
    _at_least("--rounds", rounds, 1)
    _at_least("--max-batches", max_batches, 0, "0: sized by the warm-up")
    if rows < 2 * global_batch:
        fail(f"--rows {rows}: must be >= 2 x --global-batch ({2 * global_batch:,})")
    if work_dir is not None and not work_dir.exists():
        fail(f"--work-dir {work_dir}: does not exist")
    if work_dir is not None and not work_dir.is_dir():
        fail(f"--work-dir {work_dir}: not a directory")
    if part_rows:
        if part_rows < global_batch or parts < 1:
            fail(
                f"--part-rows must be at least --global-batch and --parts positive, got {part_rows}, {parts}"
            )
        result = loader_parts.run_parts_bench(
            part_rows,
            parts,
            global_batch,
            rounds,
            max_batches or loader_parts.RUN_BATCHES,
            work_dir,
        )
        _show(result, json_out, loader_parts.print_result)
        return
    if not 1 <= parts <= rows:
        fail(f"--parts must be in [1, --rows], got {parts}")
    if multihot:
        try:
            sizes = [int(v) for v in table_rows.split(",")]
        except ValueError:
            fail(
                f"--table-rows {table_rows!r}: expected comma-separated integers, e.g. 1000000,10000000"
            )
        if min(sizes) < 1:
            fail(f"--table-rows {table_rows!r}: every table needs at least 1 row")
        result = loader_multihot.run_multihot_bench(
            rows, global_batch, sizes, rounds, max_batches, work_dir, cache
        )
        _show(result, json_out, loader_multihot.print_result)
        return
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
        Path | None,
        typer.Option(
            help="Keep the generated file here and reuse it (default: a temporary directory)."
        ),
    ] = None,
    like: Annotated[
        str,
        typer.Option(
            help="criteo (Criteo's TSV, the default parser), or movielens / avazu (synth --like's CSV with its "
            "inferred spec: string categoricals, quoting, lists)."
        ),
    ] = "criteo",
    gzip: Annotated[
        bool,
        typer.Option(
            "--gzip",
            help="Instead: the same rows as .gz against plain text on 1 worker (per CPU-s), and the .gz on "
            "--workers against 1 (wall), no polars.",
        ),
    ] = False,
    parquet: Annotated[
        bool,
        typer.Option(
            "--parquet",
            help="Instead: the --like rows as a Parquet file with its inferred spec, rows per CPU-second "
            "against polars reading the same file (goal 1.5x).",
        ),
    ] = False,
    rounds: Annotated[
        int,
        typer.Option(
            help="Interleaved rounds after a warm-up; ratios are medians of same-round ones."
        ),
    ] = 3,
    json_out: JsonFlag = False,
) -> None:
    """Preprocess MB/s and peak RSS against a polars pipeline doing the same work (1 and all
    threads), same file."""
    honour_ctrl_c()
    try:
        _preprocess_bench(
            size_gb, workers, chunk_mb, work_dir, like, gzip, parquet, rounds, json_out
        )
    except KeyboardInterrupt:  # its temporary folder is removed on the way out
        interrupted("nothing measured")


def _preprocess_bench(
    size_gb: float,
    workers: int,
    chunk_mb: float,
    work_dir: Path | None,
    like: str,
    gzip: bool,
    parquet: bool,
    rounds: int,
    json_out: bool,
) -> None:
    from shardrec.tools.bench.preprocess.polars_pipeline import INSTALL_HINT
    from shardrec.tools.bench.preprocess.spec_bench import print_like_report, run_like_bench

    if size_gb <= 0 or workers < 1 or rounds < 1:
        fail(
            f"--size-gb ({size_gb}), --workers ({workers}) and --rounds ({rounds}) must be positive"
        )
    if parquet and gzip:
        fail("--parquet and --gzip are two different benchmarks: give one")
    if gzip:
        _gzip_bench(size_gb, workers, work_dir, chunk_mb, rounds, json_out)
        return
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
        if parquet:
            from shardrec.tools.bench.preprocess.parquet_bench import (
                print_parquet_report,
                run_parquet_bench,
            )

            result = run_parquet_bench(like, size_gb, workers, work_dir, chunk_mb, rounds)
        elif like == "criteo":
            result = bench_preprocess.run_bench(size_gb, workers, work_dir, chunk_mb, rounds)
        else:
            result = run_like_bench(like, size_gb, workers, work_dir, chunk_mb, rounds)
    except RuntimeError as e:
        fail(str(e))
    finally:
        if tmp is not None:
            tmp.cleanup()
    if parquet:
        _show(result, json_out, lambda r: print_parquet_report(r, console))
    elif like == "criteo":
        _show(result, json_out, bench_preprocess.print_report)
    else:
        _show(result, json_out, lambda r: print_like_report(r, console))


@bench_app.command("plan")
def plan(
    only: Annotated[
        str | None, typer.Option(help="Run only the cases whose name contains this text.")
    ] = None,
    reserve: Annotated[
        float, typer.Option(help="Share of each rank's memory both planners keep free.")
    ] = bench_plan.RESERVE,
    profile: Annotated[
        Path | None,
        typer.Option(
            help="Calibration profile whose cost-model verdict (bench plan-reality) applies."
        ),
    ] = None,
    measure: Annotated[
        bool, typer.Option(help="Train both plans of the CPU cases on local ranks.")
    ] = True,
    json_out: JsonFlag = False,
) -> None:
    """The plan `shardrec plan` writes vs torchrec's default planner's, priced by the better
    predictor (ratio < 1: shardrec faster), both keeping the same memory free; CPU cases trained
    too."""
    cases = [c for c in bench_plan.CASES if only is None or only in c.name]
    if not cases:
        fail(
            f"--only {only!r} matches no case (cases: {', '.join(c.name for c in bench_plan.CASES)})"
        )
    if not 0 <= reserve < 1:
        fail(f"--reserve must be in [0, 1) (got {reserve})")
    try:
        result = bench_plan.run_plan_bench(
            cases, reserve, profile, measure, show_progress=not json_out
        )
    except ValueError as e:
        fail(str(e))
    _show(result, json_out, bench_plan.print_plan_table)


@bench_app.command("plan-reality")
def plan_reality(
    world_size: Annotated[int, typer.Option(help="Local gloo ranks.")] = 2,
    max_rows: Annotated[
        int, typer.Option(help="Rows per table, at most (the demo caps ids at 50,000).")
    ] = 50_000,
    large: Annotated[
        bool,
        typer.Option(
            "--large",
            help="Tables of up to 3,000,000 rows x 32 (2.3 GiB): >= 1 GiB per rank on 2 ranks.",
        ),
    ] = False,
    dim: Annotated[int, typer.Option(help="Embedding width.")] = 16,
    tables: Annotated[
        int, typer.Option(help="Tables (Criteo's first N cardinalities, capped).")
    ] = 26,
    global_batch_size: Annotated[int, typer.Option(help="Samples per step over all ranks.")] = 2048,
    steps: Annotated[int, typer.Option(help="Timed steps per plan.")] = 8,
    rounds: Annotated[
        int, typer.Option(help="Runs of every plan; the lowest time and peak count.")
    ] = 2,
    profile: Annotated[
        Path | None,
        typer.Option(help="Use this calibration profile's figures instead of calibrating now."),
    ] = None,
    profile_out: Annotated[
        Path | None,
        typer.Option(
            help="Write a calibration profile with the better cost model and memory figure."
        ),
    ] = None,
    memory_limit_gib: Annotated[
        float,
        typer.Option(
            help="Run only plans whose estimate for all ranks is below this (0: 80% of available)."
        ),
    ] = 0.0,
    managed: Annotated[
        int,
        typer.Option(
            min=0,
            help="Make the N largest tables managed tables of their rows: their id maps, on every "
            "rank, in the estimates and the measurement (new ids every step: the maps' worst case).",
        ),
    ] = 0,
    json_out: JsonFlag = False,
) -> None:
    """Train 12+ plans (both planners', simple and bad ones) on local CPU ranks: which cost model
    orders them like the clock (Kendall tau, median error), and how close is each rank's memory
    estimate to its peak?"""
    from shardrec.tools.bench.plan import reality_bench as bench_reality

    if world_size < 2 or global_batch_size % world_size:
        fail(
            f"--world-size must be >= 2 and divide --global-batch-size ({world_size}, {global_batch_size})"
        )
    if min(steps, rounds, tables, max_rows, dim) < 1:
        fail("--steps, --rounds, --tables, --max-rows and --dim must be positive")
    try:
        result = bench_reality.run_reality(
            world_size=world_size,
            max_rows=bench_reality.LARGE_ROWS if large else max_rows,
            dim=bench_reality.LARGE_DIM if large else dim,
            num_tables=tables,
            global_batch_size=global_batch_size,
            steps=steps,
            rounds=rounds,
            profile=profile,
            memory_limit_bytes=memory_limit_gib * bench_reality.GiB,
            managed_tables=managed,
        )
    except ValueError as e:
        fail(str(e))
    if profile_out is not None:
        bench_reality.write_profile(result, profile_out)
    _show(result, json_out, bench_reality.print_reality)
    if profile_out is not None and not json_out:
        console.print(f"wrote {profile_out}; use it with `shardrec plan --profile {profile_out}`")


@bench_app.command("hitrate")
def hitrate(
    data: Annotated[Path, typer.Option(help="Dataset directory (its train split is replayed).")],
    config: Annotated[
        Path | None, typer.Option(help="Job file: batch, shuffle, multi-hot, model widths.")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", metavar="KEY=VALUE", help="Override a job setting.")
    ] = None,
    plan: Annotated[
        Path | None, typer.Option(help="A plan with cached tables (default: plan past HBM here).")
    ] = None,
    world_size: Annotated[int, typer.Option(min=1, help="Ranks to plan for (without --plan).")] = 8,
    hbm_share: Annotated[
        float, typer.Option(help="Share of the tables the ranks' HBM holds (without --plan).")
    ] = 0.3,
    batches: Annotated[
        int, typer.Option(min=0, help="Global batches to replay (0: one epoch).")
    ] = 0,
    json_out: JsonFlag = False,
) -> None:
    """Predicted UVM cache hit rates against exact LRU and LFU caches replaying the data's id
    stream."""
    from shardrec.tools.bench.plan import hitrate_bench as bench_hitrate

    try:
        result = bench_hitrate.run_hitrate(
            data, config, set_ or [], plan, world_size, hbm_share, batches
        )
    except ValueError as e:
        fail(str(e))
    _show(result, json_out, bench_hitrate.print_result)


@bench_app.command("train")
def train(
    ctx: typer.Context,
    model: Annotated[
        str,
        typer.Option(
            help="reference (the DLRM reference's shape), demo (configs/demo.toml's) or hstu "
            "(configs/dlrmv4.toml's HSTU on a synthetic event log, against a plain PyTorch layer)."
        ),
    ] = "reference",
    rows: Annotated[
        int, typer.Option(help="hstu: listens of the synthetic Yambda-like log it trains on.")
    ] = 200_000,
    steps: Annotated[
        int,
        typer.Option(
            help="Steps per variant per round (a timed window); 0: 64 for reference, 256 for demo."
        ),
    ] = 0,
    rounds: Annotated[
        int,
        typer.Option(
            help="Interleaved rounds after a warm-up; ratios are medians of same-round ones."
        ),
    ] = 5,
    quality_steps: Annotated[
        int,
        typer.Option(help="Steps every side trains from fresh weights before its validation AUC."),
    ] = 125,
    nproc: Annotated[
        int,
        # --nproc-per-node as train and eval name it; --nproc, its old name, still works.
        typer.Option(
            "--nproc-per-node",
            "--nproc",
            help="Ranks to start on this machine (on CUDA at most one per GPU).",
        ),
    ] = 2,
    device: Annotated[
        str, typer.Option(help="cpu (gloo ranks) or cuda (NCCL, one GPU per rank).")
    ] = "cpu",
    threads: Annotated[int, typer.Option(help="Torch threads per rank (both sides).")] = 1,
    managed: Annotated[
        bool,
        typer.Option(
            "--managed",
            help="Instead: managed tables (raw ids, id maps) against static tables of the same "
            "rows, the same model and draws (CPU).",
        ),
    ] = False,
    breakdown: Annotated[
        bool,
        typer.Option(
            "--breakdown",
            help="Also profile a few steps of each side: where a step's time goes, by category.",
        ),
    ] = False,
    reference: Annotated[
        Path | None,
        typer.Option(
            help="A checkout of facebookresearch/dlrm: measure against its torchrec_dlrm/dlrm_main.py "
            "itself (each side in its own processes, CPU) instead of stock torchrec. With --model "
            "hstu: a meta-recsys/generative-recommenders checkout (its root); its PyTorch attention "
            "(pytorch_hstu_mha) in the plain layer is a second baseline.",
        ),
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Training samples/s: `shardrec train`'s path (fp32, bf16) vs stock torchrec (or the DLRM
    reference), real loader vs in-memory batches; --managed: managed tables vs static ones of the
    same rows; --model hstu: HSTU against a plain PyTorch version of its layer (and the
    reference's attention, --reference), and the shares of a step in attention, lookups and
    all-to-alls."""
    from shardrec.tools.bench.train import train_report

    if model == "hstu":
        if managed or breakdown:
            fail("--managed and --breakdown are for the DLRM models (--model reference or demo)")
        _refuse_unused(ctx, ("quality_steps",), "with --model hstu")
        _hstu_train(rows, steps or 8, rounds, nproc, device, threads, reference, json_out)
        return
    if model not in bench_train.MODELS:
        fail(f"--model {model!r} is not one of {', '.join([*bench_train.MODELS, 'hstu'])}")
    _refuse_unused(ctx, ("rows",), "without --model hstu")
    if managed:
        _refuse_unused(ctx, ("breakdown", "reference", "quality_steps"), "with --managed")
    if reference is not None:  # the reference's sides evaluate after the timed steps
        _refuse_unused(ctx, ("quality_steps",), "with --reference")
    steps = steps or bench_train.MODELS[model][5]
    _check_train_counts(steps, rounds, nproc, threads)
    _at_least("--quality-steps", quality_steps, 1)
    if managed:
        if device != "cpu":
            fail("--managed measures on CPU ranks (--device cpu)")
        from shardrec.tools.bench.train.managed_bench import print_managed, run_managed_bench

        try:
            result = run_managed_bench(model, steps, rounds, nproc, threads)
        except (ValueError, RuntimeError) as e:
            fail(str(e))
        _show(result, json_out, print_managed)
        return
    breakdown_steps = BREAKDOWN_STEPS if breakdown else 0
    try:
        bench_train.check_device(device, nproc)
        if reference is not None:
            if device != "cpu":
                fail("--reference runs on CPU ranks only (--device cpu)")
            from shardrec.tools.bench.train.reference_bench import run_reference_bench

            raw = run_reference_bench(
                reference, model, steps, rounds, nproc, threads, breakdown_steps
            )
            result = train_report.summarise_reference(raw, model, nproc, threads, steps, rounds)
            _show(result, json_out, train_report.print_reference)
            return
        result = bench_train.run_bench(
            model, steps, rounds, quality_steps, nproc, device, threads, breakdown_steps
        )
    except (ValueError, RuntimeError) as e:
        fail(str(e))
    _show(result, json_out, train_report.print_result)


BREAKDOWN_STEPS = 8
"""Steps each side runs under the profiler for --breakdown."""


def _check_train_counts(steps: int, rounds: int, nproc: int, threads: int) -> None:
    _at_least("--steps", steps, 2)
    _at_least("--rounds", rounds, 1)
    _at_least("--nproc-per-node", nproc, 1)
    _at_least("--threads", threads, 1)


def _hstu_train(
    rows: int,
    steps: int,
    rounds: int,
    nproc: int,
    device: str,
    threads: int,
    reference: Path | None,
    json_out: bool,
) -> None:
    from shardrec.tools.bench.sequence import hstu_bench

    if device != "cpu":
        fail("--model hstu: measured on CPU ranks (--device cpu)")
    _at_least("--rows", rows, 1000)
    _check_train_counts(steps, rounds, nproc, threads)
    try:
        result = hstu_bench.run_bench(rows, steps, rounds, nproc, threads, reference)
    except (ValueError, RuntimeError) as e:
        fail(str(e))
    _show(result, json_out, hstu_bench.print_result)


@bench_app.command("sequence")
def sequence(
    rows: Annotated[
        int, typer.Option(help="Listens of the synthetic Yambda-like log both models train on.")
    ] = 200_000,
    seeds: Annotated[int, typer.Option(help="Runs of each model, one seed each.")] = 3,
    steps: Annotated[int, typer.Option(help="Steps of each run (0: one epoch).")] = 0,
    nproc: Annotated[int, typer.Option("--nproc-per-node", help="CPU ranks of each run.")] = 2,
    json_out: JsonFlag = False,
) -> None:
    """Held-out AUC of HSTU (configs/dlrmv4.toml) against a DLRM that pools the same history, on a
    synthetic log whose label depends on the order of each user's events; several seeds each."""
    from shardrec.tools.bench.sequence import sequence_quality

    if rows < 1000 or seeds < 2 or steps < 0 or nproc < 1:
        fail("--rows must be >= 1000, --seeds >= 2 (a spread), --steps >= 0, --nproc-per-node >= 1")
    try:
        result = sequence_quality.run_quality(rows, seeds, steps, nproc)
    except (ValueError, RuntimeError) as e:
        fail(str(e))
    _show(result, json_out, sequence_quality.print_result)


def _gzip_bench(
    size_gb: float,
    workers: int,
    work_dir: Path | None,
    chunk_mb: float,
    rounds: int,
    json_out: bool,
) -> None:
    from shardrec.tools.bench.preprocess.gzip_bench import print_gzip_report, run_gzip_bench

    with tempfile.TemporaryDirectory(prefix="shardrec-bench-") as tmp:
        work = work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        try:
            result = run_gzip_bench(size_gb, workers, work, chunk_mb, rounds)
        except RuntimeError as e:
            fail(str(e))
    _show(result, json_out, print_gzip_report)


@bench_app.command("quality")
def quality(
    days: Annotated[int, typer.Option(min=2, help="Days of the drifting log.")] = 6,
    rows_per_day: Annotated[
        int,
        typer.Option(
            help="Rows of each day (>= 1,500: fewer leave no table with the 1,000 distinct ids "
            "of a raw-id table, the tables the arms differ in)."
        ),
    ] = 60_000,
    seeds: Annotated[
        str,
        typer.Option(
            help="Model seeds, comma-separated: one run per arm and seed (the goal against the "
            "seeds' spread needs >= 2)."
        ),
    ] = "1,2,3",
    max_vocab: Annotated[
        int, typer.Option(min=4, help="Largest initial population of a table (synth's).")
    ] = 100_000,
    batch: Annotated[int, typer.Option(min=2, help="Global batch size.")] = 512,
    nproc: Annotated[
        int, typer.Option("--nproc-per-node", min=1, help="CPU ranks of every run.")
    ] = 2,
    work: Annotated[
        Path | None,
        typer.Option(
            help="Keep the data and runs here: a rerun reuses the days made of the same log and "
            "the runs trained on them with the same settings, and trains the others anew; "
            "default: a temp dir."
        ),
    ] = None,
    managed: Annotated[
        str | None,
        typer.Option(
            help="The managed arm's settings beside kind and rows, as the items of a tables.X "
            'inline table, e.g. \'policy="lru", max_age="1 days"\' ("": a table\'s defaults); '
            "default: 'policy=\"lfu\"'."
        ),
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Managed tables (1/4 of the distinct ids) vs hashing into the same rows vs an unbounded
    vocabulary, on a drifting log trained day by day with progressive validation."""
    from shardrec.tools.bench.train.quality_bench import (
        MIN_DISTINCT,
        MIN_ROWS_PER_DAY,
        print_quality,
        run_quality,
    )

    if rows_per_day < MIN_ROWS_PER_DAY:
        fail(
            f"--rows-per-day {rows_per_day}: bench quality needs >= {MIN_ROWS_PER_DAY:,} rows a "
            f"day, for tables of {MIN_DISTINCT:,} distinct ids (raw-id tables, the ones the "
            "arms differ in)"
        )
    try:
        chosen = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        fail(f"--seeds {seeds!r}: expected integers separated by commas")
    if not chosen:
        fail("--seeds: give at least one")
    try:
        settings = {} if managed is None else {"managed": managed}
        result = run_quality(work, days, rows_per_day, chosen, nproc, batch, max_vocab, **settings)
    except (ValueError, RuntimeError) as e:
        fail(str(e))
    _show(result, json_out, print_quality)


@bench_app.command("scale")
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
    work = work_dir or Path(tempfile.mkdtemp(prefix="shardrec-scale-"))
    try:
        bench_scale.prepare_work_dir(work)
        result = bench_scale.run_scale(fraction, work, steps, batch, train, workers, ranks)
    except (RuntimeError, ValueError) as e:
        fail(str(e))
    finally:
        if work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    _show(result, json_out, bench_scale.print_result)


@bench_app.command("check")
def check(
    only: Annotated[
        str | None,
        typer.Option(
            help="Run only the benchmarks whose name contains this (loader, preprocess, train)."
        ),
    ] = None,
    record: Annotated[
        bool,
        typer.Option(
            "--record", help="Write this run's medians as the floors of this machine's class."
        ),
    ] = False,
    note: Annotated[
        str, typer.Option(help="With --record: a note kept beside the floors (provisional, why).")
    ] = "",
    floors: Annotated[Path, typer.Option(help="The floors file.")] = bench_check.FLOORS,
    json_out: JsonFlag = False,
) -> None:
    """The quick benchmarks, each ratio against the floor recorded for this machine class (make
    bench-check); exit 1 when one is below its floor, too small to measure or has no floor."""
    if note and not record:
        fail(f"--note {note!r} is kept beside recorded floors: give it with --record")
    try:
        result = bench_check.run_check(only, floors, recording=record)
    except (ValueError, RuntimeError) as e:
        fail(str(e))
    if record:
        bench_check.record(result, floors, note)
    _show(result, json_out, bench_check.print_check)
    if record and not json_out:
        console.print(f"recorded the floors of {result['machine_class']} in {floors}")
    if not record and bench_check.failed(result):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
