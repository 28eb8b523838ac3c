"""`shardrec train`: check the job, run it on N local ranks through torchrun, print the summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from shardrec.tools.cli.common import console, fail, print_json
from shardrec.trainer.flags import (
    DEFAULT_OUT_DIR, ConfigFlag, DataFlag, OutDirFlag, PlanFlag, SetFlag, StepsFlag, rank_args,
)


def _print_summary(summary: dict, run_dir: Path) -> None:
    table = Table(title=f"{run_dir}: {summary['steps']} steps on {summary['world_size']} ranks, "
                        f"global batch {summary['global_batch_size']}")
    for col in ("split", "AUC", "log loss", "NE", "samples"):
        table.add_column(col, justify="right")
    for split, m in summary["eval"].items():
        table.add_row(split, f"{m['auc']:.4f}", f"{m['logloss']:.4f}", f"{m['ne']:.4f}", f"{m['samples']:,}")
    console.print(table)
    rate = summary.get("train_samples_per_s")
    if rate:
        console.print(f"training: {rate:,.0f} samples/s over {summary['train_seconds']:.1f} s")
    if summary.get("resumed_from_step") is not None:
        console.print(f"resumed from the checkpoint of step {summary['resumed_from_step']}")


def _failure_message(code: int, out_dir: Path) -> str:
    """One line after a failed run; it mentions resuming only when there is something to resume from."""
    from shardrec.trainer.checkpoint import complete_checkpoints

    message = f"training failed (torchrun exit code {code}); the ranks' messages are above"
    done = complete_checkpoints(out_dir / "checkpoints")
    if done:
        step, path = done[-1]
        message += f"; the newest complete checkpoint, {path} (step {step}), is kept and a re-run resumes from it"
    return message


def train(
    config: ConfigFlag = None,
    data: DataFlag = None,
    plan: PlanFlag = None,
    out_dir: OutDirFlag = DEFAULT_OUT_DIR,
    nproc_per_node: Annotated[int, typer.Option(help="Ranks to start on this machine.")] = 1,
    steps: StepsFlag = None,
    set_: SetFlag = None,
    max_restarts: Annotated[int, typer.Option(help="Times torchrun restarts the ranks after a failure (each resumes from the last checkpoint).")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Train a DLRM/DCNv2 on N local ranks (torchrun); resumes if OUT_DIR holds checkpoints."""
    from shardrec.trainer.launch import launch
    from shardrec.trainer.preflight import preflight

    if nproc_per_node < 1:
        fail(f"--nproc-per-node must be at least 1, got {nproc_per_node}")
    overrides = list(set_ or [])
    try:
        preflight(config, data, plan, steps, overrides, world_size=nproc_per_node)
    except ValueError as e:
        fail(str(e))
    args = rank_args(config=config, data=data, plan=plan, out_dir=out_dir, steps=steps, overrides=overrides)
    code = launch(args, nproc_per_node, max_restarts)
    if code != 0:
        fail(_failure_message(code, out_dir))
    summary = json.loads((out_dir / "summary.json").read_text())
    if json_out:
        print_json(summary)
        return
    _print_summary(summary, out_dir)
    from shardrec.sharding.plan_io import load_plan
    from shardrec.sharding.report import tables_table

    console.print(tables_table(load_plan(out_dir / "plan.json")))


def register(app: typer.Typer) -> None:
    app.command()(train)
