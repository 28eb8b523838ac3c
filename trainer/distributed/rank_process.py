"""What every rank program (`python -m shardrec.trainer`, `shardrec eval`'s ranks) does first and
last: its logging and warning filters, the one line it leaves when it fails, and a clean exit."""

from __future__ import annotations

import logging
import os
import sys
import traceback
import warnings
from typing import NoReturn

# Warnings every CPU run of the pinned stack prints on each rank (seen in `shardrec -v train`
# runs: plain and pipelined loops, resume, DCNv2 with bf16 all-to-all). Anything else, such as
# fbgemm's warning about out-of-range ids, stays visible.
KNOWN_HARMLESS_WARNINGS = (
    # DistributedModelParallel wraps the dense part in DDP with an argument DDP deprecates.
    r"`broadcast_buffers` is deprecated",
    # torchrec shards tables as ShardedTensors; DCP and their .size() warn on every resume.
    r"Please use DTensor instead and we are deprecating ShardedTensor",
    # torchrec's row- and column-wise collectives (torchrec.distributed.comm_ops) call the
    # torch.distributed names that torch 2.13 renamed: one warning per rank and name, train and
    # eval.
    r"`torch.distributed.reduce_scatter_tensor` is deprecated",
    r"`torch.distributed.all_gather_into_tensor` is deprecated",
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


def report_failure(reason: str) -> None:
    """Leave this rank's one-line reason for failing where `shardrec train` reads it for its last
    line (trainer.distributed.launch); nothing under a plain torchrun."""
    from shardrec.trainer.distributed.dist import launched_rank
    from shardrec.trainer.distributed.launch import launcher_directory

    shared = launcher_directory()
    if shared is None:
        return
    try:
        line = " ".join(reason.split())
        (shared / f"rank-{launched_rank()}.error").write_text(
            (line if len(line) <= 500 else line[:497] + "...") + "\n"
        )
    except OSError:
        pass  # the launcher's directory is gone: it is ending the job anyway


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


def exit_after_cuda_failure() -> NoReturn:
    """End a CUDA rank whose work raised an unexpected error, at once and with its traceback.

    Such an error is often a device-side assert (fbgemm's FATAL bounds check on an id beyond its
    table, an illegal address): this rank's CUDA context is unusable and its peers sit in an
    NCCL collective that will never complete. Interpreter teardown could wait on that NCCL work;
    exiting directly lets torchrun see the failure within its monitor interval and stop the
    other ranks, instead of them waiting out dist.timeout_s (600 s).
    """
    traceback.print_exc()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
