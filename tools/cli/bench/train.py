"""`shardrec bench train`: training samples/s against stock torchrec or the DLRM reference;
managed tables against static ones (--managed); HSTU against a plain layer (--model hstu)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardrec.tools.bench.train import train_bench as bench_train
from shardrec.tools.cli.bench.options import (
    JsonFlag,
    at_least,
    refuse_unused,
    show,
    stops_in_one_line,
)
from shardrec.tools.cli.common import fail


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
        refuse_unused(ctx, ("quality_steps",), "with --model hstu")
        _hstu_train(rows, steps or 8, rounds, nproc, device, threads, reference, json_out)
        return
    if model not in bench_train.MODELS:
        fail(f"--model {model!r} is not one of {', '.join([*bench_train.MODELS, 'hstu'])}")
    refuse_unused(ctx, ("rows",), "without --model hstu")
    if managed:
        refuse_unused(ctx, ("breakdown", "reference", "quality_steps"), "with --managed")
    if reference is not None:  # the reference's sides evaluate after the timed steps
        refuse_unused(ctx, ("quality_steps",), "with --reference")
    steps = steps or bench_train.MODELS[model][5]
    _check_train_counts(steps, rounds, nproc, threads)
    at_least("--quality-steps", quality_steps, 1)
    if managed:
        if device != "cpu":
            fail("--managed measures on CPU ranks (--device cpu)")
        from shardrec.tools.bench.train.managed_bench import print_managed, run_managed_bench

        try:
            result = run_managed_bench(model, steps, rounds, nproc, threads)
        except (ValueError, RuntimeError) as e:
            fail(str(e))
        show(result, json_out, print_managed)
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
            show(result, json_out, train_report.print_reference)
            return
        result = bench_train.run_bench(
            model, steps, rounds, quality_steps, nproc, device, threads, breakdown_steps
        )
    except (ValueError, RuntimeError) as e:
        fail(str(e))
    show(result, json_out, train_report.print_result)


BREAKDOWN_STEPS = 8
"""Steps each side runs under the profiler for --breakdown."""


def _check_train_counts(steps: int, rounds: int, nproc: int, threads: int) -> None:
    at_least("--steps", steps, 2)
    at_least("--rounds", rounds, 1)
    at_least("--nproc-per-node", nproc, 1)
    at_least("--threads", threads, 1)


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
    at_least("--rows", rows, 1000)
    _check_train_counts(steps, rounds, nproc, threads)
    try:
        result = hstu_bench.run_bench(rows, steps, rounds, nproc, threads, reference)
    except (ValueError, RuntimeError) as e:
        fail(str(e))
    show(result, json_out, hstu_bench.print_result)


def register(bench_app: typer.Typer) -> None:
    bench_app.command("train")(stops_in_one_line(train))
