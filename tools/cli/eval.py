"""`shardrec eval RUN_DIR`: evaluate a run's checkpoint on a split, at any world size (torchrun)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from shardrec.tools.cli.common import (
    counted,
    fail,
    interrupted,
    print_json,
    refuse_inside_a_launched_group,
    sigterm_as_ctrl_c,
)
from shardrec.tools.console import console
from shardrec.trainer.distributed.devices import DEVICE_KINDS
from shardrec.trainer.rundir.metrics_log import auc_text

if TYPE_CHECKING:
    from shardrec.trainer.inference.eval_request import EvalRequest

STOPPED = "nothing evaluated (eval writes no files)"
"""interrupted()'s line for a stopped eval."""


def eval_run(
    run_dir: Annotated[Path, typer.Argument(help="Run directory of `shardrec train`.")],
    checkpoint: Annotated[
        int | None,
        typer.Option("--checkpoint", help="Step of the checkpoint (default: the newest)."),
    ] = None,
    split: Annotated[
        str, typer.Option("--split", help="Split to evaluate: test, val or train.")
    ] = "test",
    nproc_per_node: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Ranks to start on this machine (any number that divides the evaluation batch; the "
            "checkpoint is resharded). "
            "Default: the run's own world size, whose AUC equals the run's own evaluation bit for bit.",
        ),
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            "--data",
            help="Evaluate on this dataset instead of the run's own (same features and cardinalities); "
            "without it, data that changed since training is refused. A checkpoint of an earlier "
            "stretch (`train --continue-on`) evaluates on that stretch's data.",
        ),
    ] = None,
    device: Annotated[
        str,
        typer.Option(
            "--device",
            help="Evaluate on cpu or cuda ranks, whatever the run trained on; auto: CUDA where "
            "torch can use it here, else the CPU.",
        ),
    ] = "auto",
    json_out: Annotated[bool, typer.Option("--json", help="Print the metrics as JSON.")] = False,
) -> None:
    """Evaluate a checkpoint: at the run's world size the AUC equals the run's own evaluation bit
    for bit."""
    from shardrec.trainer.inference.eval_request import (
        EvalRequest,
        check_checkpoint_files,
        check_request,
        trained_world_size,
        with_stretch_data,
    )

    refuse_inside_a_launched_group("eval", nproc_per_node)
    if device not in DEVICE_KINDS:
        fail(f"--device {device!r} is not one of {', '.join(DEVICE_KINDS)}")
    request = EvalRequest(run_dir, checkpoint, split, data, device)
    with sigterm_as_ctrl_c():
        try:
            try:
                defaulted = nproc_per_node is None
                nproc_per_node = nproc_per_node or trained_world_size(run_dir)
                request = with_stretch_data(request)
                check_request(request, nproc_per_node, defaulted)
                check_checkpoint_files(request)
            except ValueError as e:
                fail(str(e))
            metrics = _evaluate(request, nproc_per_node)
        except KeyboardInterrupt:  # before the ranks started, or after they ended
            interrupted(STOPPED)
    if json_out:
        print_json(metrics)
        return
    on = f"{metrics['split']} of {request.data}" if request.data is not None else metrics["split"]
    console.print(
        f"{run_dir} step {metrics['step']} on {on} ({counted(metrics['world_size'], 'rank')}, trained on "
        f"{metrics['trained_world_size']}): AUC {auc_text(metrics, 6)}  log loss {metrics['logloss']:.6f}  "
        f"NE {metrics['ne']:.6f}  {metrics['samples']:,} samples in {metrics['seconds']:.1f} s",
        highlight=False,
    )


def _evaluate(request: EvalRequest, nproc_per_node: int) -> dict:
    """Run the ranks on `request` and return rank 0's metrics. A SIGINT/SIGTERM while they run
    ends them, and this command in interrupted()'s line, before their folder is removed."""
    from shardrec.trainer.distributed.launch import launch

    with tempfile.TemporaryDirectory(prefix="shardrec-eval-") as tmp:
        # The ranks take the request as one file.
        request_file, result = Path(tmp) / "request.json", Path(tmp) / "result.json"
        request_file.write_text(request.to_json())
        args = ["--request", str(request_file), "--result", str(result)]
        # The rank program by name: importing it here would import torch in this process. Nothing
        # to checkpoint, so a signal ends the ranks at once (no grace), and `launch` returns once
        # they are gone.
        ended = launch(
            args, nproc_per_node, module="shardrec.trainer.inference.eval_entry", stop_grace_s=0
        )
        if ended.signal:
            interrupted(STOPPED, ended.signal)
        if ended.refusal:  # the ranks' own line (torchrun's agent said nothing beside it)
            fail(ended.refusal)
        if ended.code != 0 or not result.is_file():
            fail(
                f"evaluation failed: {ended.cause}"
                if ended.cause
                else f"evaluation failed (torchrun exit code {ended.code})"
            )
        return json.loads(result.read_text())


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_run)
