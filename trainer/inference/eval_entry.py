"""The per-rank program of `shardrec eval` that torchrun starts: join the group, evaluate a
checkpoint (trainer.inference.evaluate), and rank 0 writes the result where the CLI reads it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from shardrec.dataloader.files import atomic_write_bytes


def rank_main(
    run_dir: Annotated[Path, typer.Argument(help="The run directory.")],
    result: Annotated[Path, typer.Option("--result", help="Where rank 0 writes the metrics (JSON).")],
    checkpoint: Annotated[
        int | None, typer.Option("--checkpoint", help="Checkpoint step (default: the newest).")
    ] = None,
    split: Annotated[str, typer.Option("--split", help="Split to evaluate.")] = "test",
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")] = "auto",
    data: Annotated[
        Path | None, typer.Option("--data", help="Other data of the run's schema (default: the run's own).")
    ] = None,
) -> None:
    """Evaluate a checkpoint on this rank (started by torchrun; see `shardrec eval`)."""
    # The training entry's logging, warning filter and clean exit apply to these ranks unchanged.
    from shardrec.trainer.distributed.rank_process import configure_rank_logging, exit_cleanly

    configure_rank_logging()
    from shardrec.trainer.distributed.dist import init_distributed, shutdown
    from shardrec.trainer.inference.evaluate import EvalRequest, evaluate_checkpoint

    try:
        env = init_distributed(device)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(1) from None
    try:
        metrics = evaluate_checkpoint(EvalRequest(run_dir, checkpoint, split, data), env)
    except ValueError as e:
        if env.is_main:
            print(f"error: {e}", file=sys.stderr)
        shutdown()
        raise typer.Exit(1) from None
    if env.is_main:
        atomic_write_bytes(result, (json.dumps(metrics, indent=2) + "\n").encode())
    exit_cleanly()


def main() -> None:
    typer.run(rank_main)


if __name__ == "__main__":
    main()
