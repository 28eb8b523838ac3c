"""The per-rank program of `shardrec eval` that torchrun starts: join the group, evaluate a
checkpoint (trainer.inference.evaluate), and rank 0 writes the result where the CLI reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from shardrec.dataloader.util.files import atomic_write_bytes


def rank_main(
    request: Annotated[
        Path, typer.Option("--request", help="What to evaluate: an EvalRequest as JSON.")
    ],
    result: Annotated[
        Path, typer.Option("--result", help="Where rank 0 writes the metrics (JSON).")
    ],
) -> None:
    """Evaluate a checkpoint on this rank (started by torchrun; see `shardrec eval`)."""
    from shardrec.trainer.distributed.lifeline import die_with_parent

    # first: a killed launcher must not leave ranks evaluating on, nor reading the request file
    # it removed (trainer.distributed.lifeline)
    die_with_parent()
    # The logging, warning filter and clean exit of every rank program.
    from shardrec.trainer.distributed.rank_process import (
        configure_rank_logging,
        exit_after_cuda_failure,
        exit_after_peer_loss,
        exit_cleanly,
        exit_refused,
        peer_gone,
    )

    configure_rank_logging()
    from shardrec.trainer.distributed.dist import init_distributed
    from shardrec.trainer.inference.eval_request import EvalRequest, run_config
    from shardrec.trainer.inference.evaluate import evaluate_checkpoint

    try:
        wanted = EvalRequest.from_json(request.read_text())
        # Bound to cores as the run's training ranks were (dist.bind_cores): on 2 CPU ranks,
        # unbound threads migrate and wait on each other at the collectives.
        bind_cores = run_config(wanted.run_dir).dist.bind_cores
        env = init_distributed(wanted.device, bind_cores=bind_cores)
    except ValueError as e:
        exit_refused(str(e))
    try:
        metrics = evaluate_checkpoint(wanted, env)
    except ValueError as e:  # the launcher shows it as the one line
        exit_refused(str(e))
    except Exception as e:
        if peer_gone(e):  # another rank died first: one line here, the launcher names that rank
            exit_after_peer_loss(e)
        if env.device.type == "cuda":
            exit_after_cuda_failure()
        raise
    if env.is_main:
        atomic_write_bytes(result, (json.dumps(metrics, indent=2) + "\n").encode())
    exit_cleanly()


def main() -> None:
    typer.run(rank_main)


if __name__ == "__main__":
    main()
