"""Start ranks: the per-rank trainer under torchrun (torch.distributed.run, the elastic
launcher). A function on N local processes (tests, calibration, benchmarks) is local_ranks.py's.

`python -m shardrec.trainer.distributed.launch TORCHRUN_ARGS` is torchrun itself, minus its failure
traceback and the log folder its agent leaves in the temporary directory on every run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from shardrec.trainer.distributed.dist import LOOPBACK
from shardrec.trainer.distributed.failures import (
    FAILED_FIRST,
    LaunchResult,
    failure_record,
    failures_line,
    read_reports,
    refused_only,
)

JOB_ID_ENV = "SHARDREC_JOB_ID"
"""Where the launcher passes its job id down to the ranks (rank 0 names it in the run directory's
lock)."""
LAUNCHER_DIR_ENV = "SHARDREC_LAUNCHER_DIR"
"""A directory of `launch`'s that torchrun's agent and the ranks share with it: the stop file
(STOP_FILE, created when the launcher is asked to stop) and the failures they report."""
STOP_FILE = "stop"
RANK_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
"""glibc malloc settings of the trainer's ranks (`rank_malloc_environment`): blocks up to 32 MiB
(its largest mmap threshold) from the heap, and up to 1 GiB of freed heap kept, not trimmed."""
RENDEZVOUS_BACKEND = "shardrec-loopback"
"""The rendezvous backend of a single-node job (rendezvous.py, which torchrun_main registers
under this name): named here, where `shardrec train` builds the agent's command without torch."""
LOG_DIR_ENV = "PET_LOG_DIR"
"""torchrun's own variable for its --log-dir: a log directory the user chose, which stays."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
STOP_CHECK_STEPS = 10
"""The most steps between two agreements of the ranks to stop (trainer.distributed.stop): how many
steps a stop may take."""
_early_signals: list[int] | None = None
"""The stop signals received since `stop_requests()` began (None: outside it)."""


def torchrun_command(
    entry_args: list[str],
    nproc_per_node: int,
    *,
    max_restarts: int = 0,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
    module: str = "shardrec.trainer",
) -> list[str]:
    """The torchrun command line that starts `python -m MODULE ENTRY_ARGS` on every rank.

    One node without an endpoint rendezvous through `trainer.distributed.rendezvous` (a store on
    127.0.0.1, on a port the kernel picks and the store keeps); several nodes need the same
    `rdzv_endpoint` (HOST:PORT of node 0) and `rdzv_id` on each. Without `rdzv_id` a single-node
    command gets a fresh one, a multi-node one an id derived from the endpoint (the same on every
    node).
    """
    if nproc_per_node < 1:
        raise ValueError(f"--nproc-per-node must be at least 1, got {nproc_per_node}")
    if nnodes > 1 and not rdzv_endpoint:
        raise ValueError("several nodes need a rendezvous endpoint HOST:PORT")
    if rdzv_endpoint:
        rendezvous = ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}"]
        rdzv_id = rdzv_id or f"shardrec-{rdzv_endpoint}"
    else:
        rendezvous = [
            f"--rdzv-backend={RENDEZVOUS_BACKEND}",
            f"--rdzv-endpoint={LOOPBACK}:0",
            f"--local-addr={LOOPBACK}",
        ]
    return [
        sys.executable,
        "-m",
        "shardrec.trainer.distributed.launch",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        f"--max-restarts={max_restarts}",
        *rendezvous,
        f"--rdzv-id={rdzv_id or new_job_id()}",
        "-m",
        module,
        *entry_args,
    ]


def new_job_id() -> str:
    """A fresh id for a job: its rendezvous id, and the holder named in its run directory's lock."""
    return uuid.uuid4().hex


def launcher_job_id() -> str | None:
    """The job id `shardrec train` passed down to its ranks (None under a plain torchrun)."""
    return os.environ.get(JOB_ID_ENV) or None


def launcher_directory() -> Path | None:
    """The directory `launch` shares with its ranks (None: started by a plain torchrun)."""
    shared = os.environ.get(LAUNCHER_DIR_ENV)
    return Path(shared) if shared else None


def rank_environment(nproc_per_node: int, job_id: str | None = None) -> dict[str, str]:
    """The environment for torchrun and the ranks: the cores shared out among the ranks unless
    OMP_NUM_THREADS is set, this process named as the parent they must not outlive, the job id.

    PYTHONSAFEPATH (python -P): torchrun and the ranks start as `python -m`, which puts the current
    directory first on sys.path, so that a user's file named like a module of the standard
    library (a grp.py: tarfile imports grp) was imported in its place and the run failed."""
    from shardrec.trainer.distributed.devices import rank_threads
    from shardrec.trainer.distributed.lifeline import child_environment

    env = child_environment()
    env["PYTHONSAFEPATH"] = "1"
    threads = rank_threads(nproc_per_node)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    if job_id:
        env[JOB_ID_ENV] = job_id
    return env


def rank_malloc_environment(environ: dict[str, str]) -> dict[str, str]:
    """RANK_MALLOC_ENV for the ranks of `environ`, or nothing where the user set either (theirs
    win).

    A training step frees and allocates the same few-MiB activations and gradients every step.
    glibc's defaults serve blocks past its mmap threshold with mmap and give a heap's free top
    back to the OS past its trim threshold, so each step faulted in again (zeroing the pages,
    charging the memory cgroup) memory it had just given back: ~4,000-5,800 page faults a bf16
    reference-model rank step on an AMX host, where the matmuls are cheap; kept, ~0-160 (CPU a
    step 204 -> 182 ms, the median of six loaded launch pairs, three of which read equal). Kept
    in the heap, a rank holds its step's peak working set, as it does mid-step anyway."""
    if any(name in environ for name in RANK_MALLOC_ENV):
        return {}
    return dict(RANK_MALLOC_ENV)


def launch(
    entry_args: list[str],
    nproc_per_node: int,
    max_restarts: int = 0,
    job_id: str | None = None,
    *,
    stop_grace_s: float = 60.0,
    notify: Callable[[str], None] = lambda line: None,
    module: str = "shardrec.trainer",
) -> LaunchResult:
    """Run `python -m MODULE ENTRY_ARGS` on N ranks under torchrun on this machine and wait for it;
    the result says why ranks failed, as they and torchrun's agent reported it.

    torchrun, and through it the ranks, die with this process (`trainer.distributed.lifeline`).
    SIGTERM or SIGINT asks the ranks to stop within a few steps, write a checkpoint and leave
    (`trainer.distributed.stop`); `notify` gets a line saying so. A second signal, or
    `stop_grace_s` seconds without an end, ends them at once. A signal this process started with
    ignored (SIGINT, in a script's `cmd &`) stays ignored.
    """
    job_id = job_id or new_job_id()
    command = torchrun_command(
        entry_args, nproc_per_node, max_restarts=max_restarts, rdzv_id=job_id, module=module
    )
    with tempfile.TemporaryDirectory(prefix="shardrec-launch-") as shared:
        env = rank_environment(nproc_per_node, job_id)
        env |= rank_malloc_environment(env)
        env[LAUNCHER_DIR_ENV] = shared
        result = _supervise(
            # A session of its own, as torchrun gives each rank: a terminal's Ctrl-C reaches this
            # process alone (the stop file carries it on). In the agent's seconds of imports before
            # torchrun_main ignores it, it ended the agent in a KeyboardInterrupt traceback.
            lambda: subprocess.Popen(command, env=env, start_new_session=True),
            Path(shared) / STOP_FILE,
            stop_grace_s,
            notify,
        )
        return dataclasses.replace(result, **read_reports(Path(shared)))


@contextmanager
def stop_requests() -> Iterator[None]:
    """Record SIGTERM/SIGINT from now until the end of the block, whose `launch` takes them as stop
    requests: a signal in the seconds before the ranks start stops them as a later one does, and
    one after they left (a repeat of Slurm's) no longer kills the finished command. A signal the
    command started with ignored (SIGINT, for a script's `cmd &`) stays ignored."""
    global _early_signals
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _early_signals = []
    received = _early_signals
    previous = {
        sig: signal.signal(sig, lambda signum, frame: received.append(signum))
        for sig in STOP_SIGNALS
        if signal.getsignal(sig) is not signal.SIG_IGN  # kept ignored, as _supervise keeps it
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _early_signals = None


def stop_requested() -> str | None:
    """The first SIGTERM/SIGINT that `stop_requests` recorded so far (None: none): one before
    the launch asks for no rank to start."""
    return signal.Signals(_early_signals[0]).name if _early_signals else None


def _supervise(
    start: Callable[[], subprocess.Popen],
    stop_file: Path,
    grace_s: float,
    notify: Callable[[str], None],
) -> LaunchResult:
    """Start the agent (`start`) and wait for it, turning the first SIGTERM/SIGINT into
    `stop_file` and a second into a kill."""
    from shardrec.trainer.distributed.lifeline import kill_tree

    # Those received before the start (stop_requests) are requests too.
    received: list[int] = _early_signals if _early_signals is not None else []
    previous = {}
    if threading.current_thread() is threading.main_thread():
        # A signal this launcher started with ignored stays ignored: a script's `cmd &` (a shell
        # without job control) starts its job with SIGINT ignored, so that a Ctrl-C meant for the
        # script's foreground command does not stop it (POSIX; Python keeps it ignored too).
        previous = {
            sig: signal.signal(sig, lambda signum, frame: received.append(signum))
            for sig in STOP_SIGNALS
            if signal.getsignal(sig) is not signal.SIG_IGN
        }
    first, deadline, forced = None, 0.0, ""
    try:
        proc = start()  # after the handlers: a signal while it starts is a stop request too
        while True:
            try:
                return LaunchResult(proc.wait(timeout=0.2), first, forced)
            except subprocess.TimeoutExpired:
                pass
            if received and first is None:
                first, deadline = signal.Signals(received[0]).name, time.monotonic() + grace_s
                stop_file.touch()
                notify(
                    f"{first}: the ranks stop within {STOP_CHECK_STEPS} steps and write a checkpoint "
                    f"(within {grace_s:g} s, checkpoint.stop_grace_s); a second signal stops at once"
                )
            if len(received) > 1:
                forced = f"stopped at once by a second signal ({signal.Signals(received[1]).name})"
            elif first is not None and time.monotonic() > deadline:
                forced = (
                    f"stopped at once: no checkpoint within {grace_s:g} s (checkpoint.stop_grace_s; "
                    "raise it where a step and a checkpoint take longer)"
                )
            if forced and proc.poll() is None:
                # The agent and the ranks, gone before the caller removes the files they read: a
                # rank still importing has not yet asked to die with the agent (lifeline).
                kill_tree(proc)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def torchrun_main(argv: list[str]) -> int:
    """torchrun with its arguments `argv`, ending in one line instead of a traceback when ranks
    fail.

    The ranks print their own errors; torchrun's ChildFailedError traceback would only bury them.
    """
    import logging

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main

    from shardrec.trainer.distributed import rendezvous
    from shardrec.trainer.distributed.lifeline import die_with_parent

    # and the ranks die with this agent (each asks the same in trainer.loop.train_entry)
    die_with_parent()
    if os.environ.get(LAUNCHER_DIR_ENV):
        # `launch` turns SIGTERM/SIGINT into a stop request the ranks act on, and ends this agent
        # itself on a second one. torchrun's own handling would forward the signal to the ranks and
        # kill them 30 s later; a signal to every process of the job (Slurm's) reaches this agent
        # too.
        argv = ["--signals-to-handle=SIGHUP,SIGQUIT", *argv]
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
    rendezvous.register(RENDEZVOUS_BACKEND)
    # Its "failed (exitcode ...)" line says what the line below says.
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)
    with _agent_log_dir(argv) as argv:
        try:
            main(argv)
        except ChildFailedError as e:
            rank, failure = e.get_first_failure()
            shared = launcher_directory()
            refused = refused_only(shared, e.failures)
            if not refused:  # a refusal is the launcher's one line; a crash keeps this one too
                print(f"torchrun: {failures_line(rank, failure, e.failures)}", file=sys.stderr)
            if shared is not None:  # for `shardrec train`'s last line
                record = {
                    **failure_record(failure),
                    "rank": rank,
                    "failures": {str(r): failure_record(f) for r, f in e.failures.items()},
                    "refused": refused,
                }
                (shared / FAILED_FIRST).write_text(json.dumps(record))
            return 1
        return 0


@contextmanager
def _agent_log_dir(argv: list[str]) -> Iterator[list[str]]:
    """torchrun's arguments `argv` with a log directory of this run's own, removed at its end.

    Given none, torch's agent makes a `torchelastic_XXXXXXXX` folder in the temporary directory on
    every run (DefaultLogsSpecs) and never removes it. Without --redirects/--tee (torchrun_command
    passes neither) only the ranks' error files go there, which the agent reads before it returns.
    The ranks' own TMPDIR stays as it was. Under `launch` the folder lies in its directory, which
    `launch` removes even after it killed this agent. A --log-dir in `argv` (the last one counts)
    or in PET_LOG_DIR is the user's and stays.
    """
    if os.environ.get(LOG_DIR_ENV):
        yield argv
        return
    with tempfile.TemporaryDirectory(
        prefix="torchrun-logs-", dir=launcher_directory(), ignore_cleanup_errors=True
    ) as logs:
        yield [f"--log-dir={logs}", *argv]


if __name__ == "__main__":
    sys.exit(torchrun_main(sys.argv[1:]))
