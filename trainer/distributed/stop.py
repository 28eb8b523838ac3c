"""A stop that keeps the work: SIGTERM or SIGINT asks the ranks to stop within a few steps, write
a checkpoint and leave.

What Slurm, Kubernetes and preemptible clouds send before they kill is SIGTERM, to the launcher
(Kubernetes, a plain `kill`) or to every process of the job (Slurm); a terminal's Ctrl-C sends
SIGINT to the foreground process group. So a stop request reaches a rank either as a signal of
its own or through the stop file that `shardrec train` creates when it is signalled
(trainer.distributed.launch.launch). Each rank records the request (`StopRequest`); because ranks
see it at different steps, they agree on it (`StopAgreement`) before acting.

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
from pathlib import Path
from typing import TypeVar

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
                "%s: stopping when the ranks next agree, then writing a checkpoint (a second signal stops at once)",
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
    """The ranks' common answer to "has any rank been asked to stop?".

    The ranks agree at their loss reports (trainer.loop.steps.LossWindow carries each rank's
    request in the collective it makes anyway, at least every STOP_CHECK_STEPS steps), not in an
    all-reduce of their own every step (~8% of a demo step on CPU). Once they agree, no
    rank takes another batch: the steps in flight finish, and every rank stops at the same step.
    """

    def __init__(self, request: StopRequest) -> None:
        self.request = request
        self.stopped = False

    def until_stopped(self, batches: Iterator[T]) -> Iterator[T]:
        """`batches`, ending early once the ranks agreed to stop. The check comes before a batch is
        taken: a loader counts a batch as consumed when it hands it over (its checkpointed
            position)."""
        while not self.stopped:
            try:
                batch = next(batches)
            except StopIteration:
                return
            yield batch
