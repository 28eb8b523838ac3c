"""A stop that keeps the work: SIGTERM or SIGINT asks the ranks to finish the current step, write
a checkpoint and leave.

What Slurm, Kubernetes and preemptible clouds send before they kill is SIGTERM, to the launcher
(Kubernetes, a plain `kill`) or to every process of the job (Slurm); a terminal's Ctrl-C sends
SIGINT to the foreground process group. So a stop request reaches a rank either as a signal of
its own or through the stop file that `shardrec train` creates when it is signalled
(trainer.distributed.launch.launch). Each rank records the request (`StopRequest`); because ranks see it at
different steps, they agree on it (`StopAgreement`) before acting: one all-reduce per step on a
gloo group, started asynchronously and read one step later, so no step waits on it.

A second signal stops at once (the default action of the signal). One sent a second or less
after the first counts as the same request: under Slurm a rank gets SIGTERM from Slurm and again
from torchrun's agent, which forwards what it receives.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist

from shardrec.trainer.distributed.launch import STOP_FILE, STOP_SIGNALS, launcher_directory

logger = logging.getLogger(__name__)

SAME_REQUEST_S = 1.0
"""A second signal within this many seconds of the first is the same request, not a second one."""

T = TypeVar("T")


class StopRequest:
    """This process's stop request: the first SIGTERM/SIGINT it got, or the launcher's stop file."""

    def __init__(self, stop_file: Path | None = None) -> None:
        shared = launcher_directory()
        self.stop_file = stop_file or (shared / STOP_FILE if shared is not None else None)
        self.signal_name: str | None = None
        self._first_at = 0.0

    def install(self) -> StopRequest:
        """Handle SIGTERM and SIGINT in this (main) thread from now on; returns self."""
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._on_signal)
        return self

    def _on_signal(self, signum: int, frame: object) -> None:
        now = time.monotonic()
        if self.signal_name is None:
            self.signal_name, self._first_at = signal.Signals(signum).name, now
            logger.warning(
                "%s: finishing the current step and writing a checkpoint (a second signal stops at once)",
                self.signal_name,
            )
        elif now - self._first_at > SAME_REQUEST_S:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    @property
    def requested(self) -> bool:
        if self.signal_name is None and self.stop_file is not None and self.stop_file.exists():
            self.signal_name = "the launcher's stop request"
        return self.signal_name is not None


class StopAgreement:
    """The ranks' common answer to "has any rank been asked to stop?", asked once per step.

    Every rank must call `agreed()` the same number of times (once per batch it takes), so the
    answers, which lag the requests by one call, are the same on every rank at the same step.
    """

    def __init__(self, request: StopRequest, timeout_s: float) -> None:
        self.request = request
        self.group = (
            dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
            if dist.is_initialized() and dist.get_world_size() > 1
            else None
        )
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._pending: dist.Work | None = None
        self.stopped = False

    def agreed(self) -> bool:
        """True once every rank knows of a request made before the previous call."""
        if self.stopped:
            return True
        if self.group is None:
            self.stopped = self.request.requested
            return self.stopped
        if self._pending is not None:
            self._pending.wait()
            self.stopped = bool(self._flag.item())
        if not self.stopped:
            self._flag = torch.tensor([int(self.request.requested)], dtype=torch.int32)
            self._pending = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        else:
            self._pending = None
        return self.stopped

    def until_stopped(self, batches: Iterator[T]) -> Iterator[T]:
        """`batches`, ending early once the ranks agree to stop. The check comes before a batch is
        taken: a loader counts a batch as consumed when it hands it over (its checkpointed position)."""
        while not self.agreed():
            try:
                batch = next(batches)
            except StopIteration:
                return
            yield batch

    def close(self) -> None:
        """Wait for the last all-reduce (a process group must not be destroyed under it)."""
        if self._pending is not None:
            self._pending.wait()
            self._pending = None
