"""`shardrec runs DIR`: the run directories under DIR, their step, status and best val AUC."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from shardrec.tools.cli.common import fail, print_json
from shardrec.tools.console import console


def runs(
    root: Annotated[
        Path, typer.Argument(help="Directory holding run directories (or one run directory).")
    ] = Path("runs"),
    json_out: Annotated[bool, typer.Option("--json", help="Print the runs as JSON.")] = False,
) -> None:
    """List runs: step of the newest checkpoint, status
    (complete/running/stopped/failed/damaged/misnamed), best val AUC.

    A damaged run's newest checkpoint fails its digests, or one of its files cannot be read (saved
    cut short; the file is named below the table): a rerun, eval or export of it is refused. A
    checkpoint folder not named step-NNNNNNNN (renamed or copied by hand), which no command reads,
    or named for another step than it holds (copied or moved by hand), is named below the table
    too, and its run is misnamed where train refuses to resume it (one a resume would read or
    pass over: folders.misnamed_passed_over, folders.other_step_read), and so is a
    checkpoint whose files are another's (a copy: one of the two holds another step)."""
    from shardrec.trainer.rundir import names
    from shardrec.trainer.rundir.checkpoint.folders import (
        copied_checkpoint_message,
        copied_checkpoints,
        misnamed_checkpoint_message,
        misnamed_checkpoints,
        misnamed_passed_over,
        other_step_checkpoints,
        other_step_message,
        other_step_read,
    )
    from shardrec.trainer.rundir.life import run_state

    if not root.is_dir():
        fail(f"{root}: does not exist" if not root.exists() else f"{root}: not a directory")
    rows, damages, misnamed, other_steps, copies = [], [], [], [], []
    for path in run_state.find_runs(root):
        run = run_state.read_run_dir(path)
        unread = misnamed_checkpoints(path / names.CHECKPOINTS)
        misnamed += unread
        other = other_step_checkpoints(path / names.CHECKPOINTS)
        other_steps += other
        copied = copied_checkpoints(path / names.CHECKPOINTS)
        # A copy whose step is read is said as a folder named for another step.
        copies += [pair for pair in copied if pair[0] not in dict(other)]
        damage = run_state.checkpoint_damage(run)
        refused = bool(misnamed_passed_over(path / names.CHECKPOINTS)) or (
            other_step_read(path / names.CHECKPOINTS) is not None
        )
        status = run_state.run_status(run, damaged=bool(damage), misnamed=refused)
        if status == "damaged":
            damages.append(damage)
        # A run that ended before its end resumes from its newest checkpoint: a later evaluation
        # was of a model that is gone.
        upto = -1 if run.step is None else run.step
        rows.append(
            {
                "run": str(path),
                "step": run.step,
                "status": status,
                "best_val_auc": run_state.best_auc(
                    path, upto=upto if status in ("failed", "stopped") else None
                ),
                "misnamed_checkpoints": [str(p) for p in [*unread, *dict(other)]],
                "copied_checkpoints": [str(p) for p, _ in copied],
            }
        )
    if json_out:
        print_json(rows)
        return
    if not rows:
        console.print(f"no runs under {root}", highlight=False)
        return
    table = Table(title=f"runs under {root}")
    for col, justify in (
        ("run", "left"),
        ("step", "right"),
        ("status", "left"),
        ("best val AUC", "right"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        auc = "-" if r["best_val_auc"] is None else f"{r['best_val_auc']:.4f}"
        table.add_row(r["run"], "-" if r["step"] is None else f"{r['step']:,}", r["status"], auc)
    console.print(table)
    for damage in damages:
        console.print(f"damaged: {damage}", highlight=False, soft_wrap=True)
    for path in misnamed:
        console.print(
            f"misnamed: {misnamed_checkpoint_message(path)}", highlight=False, soft_wrap=True
        )
    for path, held in other_steps:
        console.print(
            f"misnamed: {other_step_message(path, held)}", highlight=False, soft_wrap=True
        )
    for path, original in copies:
        line = copied_checkpoint_message(path, original)
        console.print(f"copied: {line}", highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command()(runs)
