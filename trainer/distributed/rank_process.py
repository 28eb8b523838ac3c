"""What every rank program (`python -m shardrec.trainer`, `shardrec eval`'s ranks) does first and
last: its logging and warning filters, the one line it leaves when it fails, and a clean exit."""

from __future__ import annotations

import importlib
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

    # torch's import sets its own loggers' levels (torch._logging): first, or "torch" below would
    # be back at WARNING once the rank imports it (dist.py no longer does).
    importlib.import_module("torch")
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


# What a collective or the rendezvous store says when a peer process is gone (killed, crashed,
# exited): gloo's TCP pair, NCCL's remote error, the store's socket. A rank that fails so is a
# consequence, not a cause.
PEER_GONE = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "connection refused",
    "remote process exited",
    "ncclremoteerror",
    "socket closed",
)


def peer_gone(error: BaseException) -> bool:
    """Whether `error` says another rank's process went away (its death is the cause, not this
    rank): torch's DistNetworkError (the store), or a collective's message naming a lost peer."""
    import torch.distributed as dist

    if isinstance(error, dist.DistNetworkError):
        return True
    text = str(error).lower()
    return any(phrase in text for phrase in PEER_GONE)


def one_line(text: str, limit: int = 500) -> str:
    """`text` on one line, cut at `limit` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def report_failure(reason: str, *, consequence: bool = False, refusal: bool = False) -> None:
    """Leave this rank's one-line reason for failing where `shardrec train` reads it for its last
    line (trainer.distributed.launch); nothing under a plain torchrun.

    consequence: the reason is the loss of another rank (the launcher names the rank that failed
    first instead). refusal: a refusal of the job (refuse)."""
    from shardrec.trainer.distributed.dist import launched_rank
    from shardrec.trainer.distributed.failures import (
        PEER_GONE_SUFFIX,
        REASON_SUFFIX,
        REFUSAL_SUFFIX,
    )
    from shardrec.trainer.distributed.launch import launcher_directory

    shared = launcher_directory()
    if shared is None:
        return
    suffix = PEER_GONE_SUFFIX if consequence else REFUSAL_SUFFIX if refusal else REASON_SUFFIX
    try:
        # A refusal is the job's one line, whole; another reason is cut into the launcher's.
        line = " ".join(reason.split()) if refusal else one_line(reason)
        (shared / f"rank-{launched_rank()}{suffix}").write_text(line + "\n")
    except OSError:
        pass  # the launcher's directory is gone: it is ending the job anyway


def exit_refused(reason: str) -> NoReturn:
    """End a rank that refused the job (bad input or state: a ValueError whose message says what
    to do), exit code 1. Under `shardrec train` or `eval` the launcher shows the refusal as the
    job's one line and torchrun's agent adds none; under a plain torchrun, the first rank of each
    node (LOCAL_RANK 0) prints it: a node's own reason (its copy of the dataset missing) is seen
    on that node's terminal, once. Exits directly, as exit_cleanly does: an interpreter teardown
    with gloo's threads alive now and then aborted ("terminate called without an active
    exception", SIGABRT), and the refusal was then reported as a killed rank."""
    from shardrec.trainer.distributed.dist import launched_local_rank, shutdown
    from shardrec.trainer.distributed.launch import launcher_directory

    report_failure(reason, refusal=True)
    if launched_local_rank() == 0 and launcher_directory() is None:
        print(f"error: {reason}", file=sys.stderr)
    shutdown()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def exit_after_peer_loss(error: BaseException) -> NoReturn:
    """End a rank whose collective failed because another rank went away, in one line: its
    traceback would only point at the collective, and the launcher names the rank that died
    first. Exits directly (a process group whose peer is gone may hang in its teardown)."""
    from shardrec.trainer.distributed.dist import launched_rank
    from shardrec.trainer.distributed.launch import launcher_directory

    text = one_line(str(error), 1000)
    # Up to the words that say what happened: gloo adds a paragraph of advice to them.
    ends = [text.lower().find(p) + len(p) for p in PEER_GONE if p in text.lower()]
    reason = f"{type(error).__name__}: {one_line(text[: min(ends)] if ends else text, 300)}"
    report_failure(reason, consequence=True)
    # With restarts left, torchrun restarts the group and no last line follows if it then finishes.
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    then = (
        f"torchrun restarts the ranks (restart {attempt + 1} of --max-restarts {restarts}), which "
        "resume from the newest checkpoint"
        if attempt < restarts
        # Under `shardrec train` its launcher's last line names that rank; a plain torchrun's
        # summary names only this node's ranks (this one), not the other node's that died.
        else "the rank that failed first is named last"
        if launcher_directory() is not None
        else "the rank that failed first may be another node's: its node's output names it"
    )
    print(f"error: rank {launched_rank()} lost another rank ({reason}); {then}", file=sys.stderr)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


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
