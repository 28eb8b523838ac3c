"""The per-rank program torchrun starts: parse, join the group, build the job, train."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path
from typing import Annotated, Optional

import typer

from shardrec.trainer.config import load_job_config
from shardrec.trainer.preflight import entry_overrides

logger = logging.getLogger(__name__)


def _configure_logging() -> None:
    # Human-readable logs come from rank 0; other ranks report warnings and errors only.
    # fbgemm logs every kernel's arguments to the root logger at INFO: keep the root at WARNING.
    from shardrec.trainer.dist import launched_rank

    rank = launched_rank()
    logging.basicConfig(
        level=logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        force=True,  # fbgemm configures the root logger on import
    )
    logging.getLogger("shardrec").setLevel(logging.INFO if rank == 0 else logging.WARNING)
    for noisy in ("torchrec", "torch"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    # Known, harmless warnings of the pinned stack (DDP inside torchrec, fx tracing notes).
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)


def rank_main(
    config: Annotated[Optional[Path], typer.Option(help="TOML job file.")] = None,
    data: Annotated[Optional[Path], typer.Option(help="Dataset directory (overrides data.path).")] = None,
    plan: Annotated[Optional[Path], typer.Option(help="Plan file from `shardrec plan`.")] = None,
    out_dir: Annotated[Path, typer.Option(help="Run directory.")] = Path("runs/train"),
    steps: Annotated[Optional[int], typer.Option(help="Stop after this many steps (overrides train.steps).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="section.key=value override.")] = None,
) -> None:
    """Train on this rank (started by torchrun; see `shardrec train`)."""
    _configure_logging()
    overrides = list(set_ or []) + entry_overrides(data, plan, steps)
    from shardrec.trainer.dist import init_distributed, shutdown
    from shardrec.trainer.loop import NonFiniteLossError
    from shardrec.trainer.run import build_job, run_job

    try:
        job_config = load_job_config(config, overrides)
        env = init_distributed(job_config.train.device)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(1)
    try:
        job = build_job(job_config, env, out_dir, job_config.sharding.plan or None)
        run_job(job)
    except (ValueError, NonFiniteLossError) as e:
        if env.is_main:
            print(f"error: {e}", file=sys.stderr)
        shutdown()
        raise typer.Exit(1)
    _exit_cleanly()


def _exit_cleanly() -> None:
    """End a successful rank without interpreter teardown.

    Every file is written and closed by now. Tearing down the interpreter with gloo's worker
    threads still holding tensors occasionally aborts the process ("terminate called without
    an active exception", pytorch/pytorch#179291), which torchrun would report as a failed
    run; so the ranks meet, destroy the process group, flush, and leave directly.
    """
    import torch.distributed as dist

    from shardrec.trainer.dist import shutdown

    if dist.is_initialized():
        dist.barrier()
    shutdown()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    typer.run(rank_main)
