"""The per-rank program torchrun starts: parse, join the group, build the job, train."""

from __future__ import annotations

import logging
import os
import sys
import warnings

import typer

from shardrec.trainer.job.config import load_job_config
from shardrec.trainer.job.flags import (
    DEFAULT_OUT_DIR,
    AllowChangeFlag,
    ConfigFlag,
    DataFlag,
    OutDirFlag,
    PlanFlag,
    SetFlag,
    StepsFlag,
)
from shardrec.trainer.job.preflight import entry_overrides

logger = logging.getLogger(__name__)

# Warnings every CPU run of the pinned stack prints on each rank (seen in `shardrec -v train`
# runs: plain and pipelined loops, resume, DCNv2 with bf16 all-to-all). Anything else, such as
# fbgemm's warning about out-of-range ids, stays visible.
KNOWN_HARMLESS_WARNINGS = (
    # DistributedModelParallel wraps the dense part in DDP with an argument DDP deprecates.
    r"`broadcast_buffers` is deprecated",
    # torchrec shards tables as ShardedTensors; DCP and their .size() warn on every resume.
    r"Please use DTensor instead and we are deprecating ShardedTensor",
)


def configure_rank_logging() -> None:
    """Logging and warning filters of a rank (this entry's and `shardrec eval`'s)."""
    # Human-readable logs come from rank 0; other ranks report warnings and errors only.
    # fbgemm logs every kernel's arguments to the root logger at INFO: keep the root at WARNING.
    from shardrec.trainer.distributed.dist import launched_rank

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
    ignore_known_warnings()


def ignore_known_warnings() -> None:
    """Hide KNOWN_HARMLESS_WARNINGS (by message, not by category)."""
    for message in KNOWN_HARMLESS_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)


def rank_main(
    config: ConfigFlag = None,
    data: DataFlag = None,
    plan: PlanFlag = None,
    out_dir: OutDirFlag = DEFAULT_OUT_DIR,
    steps: StepsFlag = None,
    set_: SetFlag = None,
    allow_change: AllowChangeFlag = None,
) -> None:
    """Train on this rank (started by torchrun; see `shardrec train`)."""
    from shardrec.trainer.distributed.lifeline import die_with_parent

    die_with_parent()  # a killed launcher must not leave ranks training on (trainer.distributed.lifeline)
    configure_rank_logging()
    overrides = list(set_ or []) + entry_overrides(data, plan, steps)
    from shardrec.trainer.distributed.dist import RankMissing, init_distributed, launched_rank, shutdown
    from shardrec.trainer.distributed.launch import launcher_job_id
    from shardrec.trainer.loop.steps import NonFiniteLossError
    from shardrec.trainer.loop.train_job import build_job, run_job
    from shardrec.trainer.rundir import lifecycle
    from shardrec.trainer.rundir.lock import acquire_run_lock

    is_main = launched_rank() == 0
    try:
        job_config = load_job_config(config, overrides)
        # Every rank reads the run directory before any joins the group: all see the same files
        # (it is on a shared filesystem), so all refuse, or stop at a complete run, together,
        # and rank 0 cannot have written this invocation's config.toml yet.
        complete = lifecycle.check_job(out_dir, job_config, list(allow_change or []))
        if complete is not None:
            if is_main:
                print(complete, file=sys.stderr)
            return
        env = init_distributed(job_config.train.device, job_config.dist.timeout_s)
    except ValueError as e:
        if is_main:
            print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(1) from None
    try:
        # Held by rank 0 until this process ends, however it ends (see trainer.rundir.lock).
        lock = acquire_run_lock(out_dir, launcher_job_id()) if env.is_main else None  # noqa: F841
        job = build_job(job_config, env, out_dir, job_config.sharding.plan or None)
        run_job(job)
    except (ValueError, NonFiniteLossError, RankMissing) as e:
        if env.is_main or isinstance(e, RankMissing):
            print(f"error: {e}", file=sys.stderr)
        shutdown()
        raise typer.Exit(1) from None
    exit_cleanly()


def exit_cleanly() -> None:
    """End a successful rank without interpreter teardown.

    Every file is written and closed by now. Tearing down the interpreter with gloo's worker
    threads still holding tensors occasionally aborts the process ("terminate called without
    an active exception", pytorch/pytorch#179291), which torchrun would report as a failed
    run; so the ranks meet, destroy the process group, flush, and leave directly.
    """
    import torch.distributed as dist

    from shardrec.trainer.distributed.dist import shutdown

    if dist.is_initialized():
        dist.barrier()
    shutdown()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main() -> None:
    typer.run(rank_main)
