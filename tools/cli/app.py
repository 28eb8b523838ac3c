"""The `shardrec` command: one typer app composed of one module per command group."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer
import typer.core
import typer.main

from shardrec.tools.cli.common import LazyGroup, configure_logging
from shardrec.tools.cli.stops import COMMANDS

VERBOSE = ("-v", "--verbose")
# What `shardrec --help` lists for each command: the first paragraph of its own help, kept here so
# that the listing imports no command module (preprocess's imports numba, synth's numpy: a second
# of start-up). tests/unit/test_cli_help.py holds each to the command's own help.
SUMMARIES = {
    "synth": "Write synthetic click logs whose labels follow a hidden model of the features: "
    "Criteo's format, or Avazu's or MovieLens-1M's shape (--like) for trying a feature spec.",
    "spec": "Feature specs (TOML): which column is the label, which are dense, categorical or "
    "lists, and the text's format. `preprocess --spec FILE` reads one.",
    "preprocess": "Turn click logs into a sharded-training dataset (parts + manifest.json): "
    "Criteo's rows, or any CSV, TSV or Parquet file a feature spec (--spec) describes.",
    "data": "Inspect, check and convert a preprocessed dataset: statistics, rows, checksums, "
    "stream digests, torchrec's .npy layout, multi-hot copies, upgrades of the old layout.",
    "plan": "Plan how embedding tables are sharded; writes a plan file `shardrec train --plan` uses.",
    "train": "Train a DLRM, DCNv2 or HSTU model on N local ranks (torchrun); resumes if OUT_DIR "
    "holds checkpoints; --continue-on DATA goes on training the run on the next data.",
    "eval": "Evaluate a checkpoint: at the run's world size the AUC equals the run's own "
    "evaluation bit for bit.",
    "export": "Write a run's checkpoint as one unsharded safetensors file.",
    "predict": "Score a preprocessed split or raw rows with an exported model, in one process (no "
    "torchrun).",
    "runs": "List runs: step of the newest checkpoint, status "
    "(complete/running/stopped/failed/damaged/misnamed), best val AUC.",
    "report": "Draw a run's loss, AUC and throughput curves (metrics.jsonl) into a PNG.",
    "config": "Show the effective job settings (defaults < job file < --set) or the defaults.",
    "bench": "Benchmarks; each but `scale` prints its ratio against a baseline measured in the "
    "same run.",
}


# Commands whose processes never use numpy's BLAS: its threads are one, unless the user set them.
# With more, numpy's import starts threads that spin idle for ~0.1 CPU-s in every process (each
# preprocess worker's too). Not for `train` and the rest: on aarch64 torch's own GEMMs are
# OpenBLAS's, and its ranks inherit the setting.
SINGLE_THREADED_BLAS = ("preprocess",)


class _LazyCommands(LazyGroup):
    package, modules, summaries = "shardrec.tools.cli", COMMANDS, SUMMARIES

    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any:
        if cmd_name in SINGLE_THREADED_BLAS and not self._listing:
            os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before its module imports numpy
        return super().get_command(ctx, cmd_name)

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        # -v after the command too (no command has a -v of its own): moved before it.
        cut = args.index("--") if "--" in args else len(args)
        verbose = [a for a in args[:cut] if a in VERBOSE]
        rest = [a for a in args[:cut] if a not in VERBOSE]
        return super().parse_args(ctx, [*verbose, *rest, *args[cut:]])


_type_in_help = typer.core.TyperOption.display_type_rich


def _flag_without_type(option: typer.core.TyperOption, ctx: typer.Context) -> str | None:
    """typer shows `<bool>` beside every flag in --help, though a flag takes no value: shown
    blank."""
    return None if option.is_flag else _type_in_help(option, ctx)


typer.core.TyperOption.display_type_rich = _flag_without_type  # type: ignore[method-assign]


def _argument_name(argument: typer.core.TyperArgument) -> str:
    """An argument's name as click and typer's docs write it (RUN_DIR): typer 0.2x shows the
    parameter's own name (run_dir) beside a metavar (INPUT), so one usage line mixed both."""
    return argument.metavar or (argument.name or "").upper()


def _argument_in_usage(argument: typer.core.TyperArgument) -> str:
    """RUN_DIR, [ROOT], INPUTS...: typer 0.2x writes a required one in braces ({run_dir}), which
    reads as a choice of values."""
    name = _argument_name(argument)
    if not argument.required:
        name = f"[{name}]"
    return f"{name}..." if argument.nargs != 1 else name


# Older typer already writes click's RUN_DIR and has neither of these.
_Argument = typer.core.TyperArgument
if hasattr(_Argument, "_usage_display_name"):
    _Argument.display_name_raw = property(_argument_name)  # type: ignore[assignment,method-assign]
    _Argument._usage_display_name = _argument_in_usage  # type: ignore[method-assign]


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"shardrec {version('shardrec')}")
        raise typer.Exit()


app = typer.Typer(
    cls=_LazyCommands,
    name="shardrec",
    help=(
        "Train DLRM-family recommendation models whose embedding tables are sharded across "
        "devices.\n\nThe flow: `synth` click logs (or bring your own: `spec infer` describes them), "
        "`preprocess` them into a dataset, `plan` how tables are sharded, `train` with torchrun, then `eval`, "
        "`export` and `predict`; `data` and `bench` inspect and measure."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    configure_logging(verbose)
