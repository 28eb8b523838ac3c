"""The per-rank program torchrun starts: parse, join the group, build the job, train."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from shardrec.trainer.distributed.rank_process import (
    configure_rank_logging,
    exit_after_cuda_failure,
    exit_after_peer_loss,
    exit_cleanly,
    exit_refused,
    peer_gone,
    report_failure,
)
from shardrec.trainer.job import flags

if TYPE_CHECKING:
    from shardrec.trainer.distributed.dist import DistEnv
    from shardrec.trainer.distributed.stop import StopRequest
    from shardrec.trainer.job.config import JobConfig

logger = logging.getLogger(__name__)


def rank_main(
    config: flags.ConfigFlag = None,
    data: flags.DataFlag = None,
    plan: flags.PlanFlag = None,
    out_dir: flags.OutDirFlag = flags.DEFAULT_OUT_DIR,
    steps: flags.StepsFlag = None,
    set_: flags.SetFlag = None,
    allow_change: flags.AllowChangeFlag = None,
    job: flags.JobFlag = None,
    continue_on: flags.ContinueOnFlag = None,
) -> None:
    """Train on this rank (started by torchrun; see `shardrec train`)."""
    from shardrec.trainer.distributed.lifeline import die_with_parent
    from shardrec.trainer.distributed.stop import StopRequest

    # a killed launcher must not leave ranks training on (trainer.distributed.lifeline)
    die_with_parent()
    stop = StopRequest().install()  # first: a signal during start-up must not kill the rank either
    configure_rank_logging()
    from shardrec.trainer.distributed.launch import launcher_directory
    from shardrec.trainer.rundir.life import run_state

    joined = _join(
        lambda: flags.rank_job(job, config, data, plan, steps, list(set_ or []), continue_on),
        direct=job is None,
        continue_on=continue_on,
        out_dir=out_dir,
        allow_change=list(allow_change or []),
    )
    if joined is None:  # complete: rank 0 said so
        exit_cleanly()
    job_config, continuing, env = joined
    summary = _train(job_config, env, out_dir, stop, continuing)
    if "stopped" in summary and env.is_main and launcher_directory() is None:
        # Under `shardrec train` the launcher says this line; under a plain torchrun, rank 0 does.
        print(run_state.stopped_message(summary["steps"]), file=sys.stderr)
    exit_cleanly()


def _join(
    resolve: Callable[[], JobConfig],
    direct: bool,
    continue_on: Path | None,
    out_dir: Path,
    allow_change: list[str],
) -> tuple[JobConfig, bool, DistEnv] | None:
    """The job this rank runs (`resolve`d from its flags; `direct`: torchrun started the rank,
    not `shardrec train`), checked against the run directory, and the group it joined; None where
    the run is already complete (rank 0 said so). A refusal exits in one line."""
    from shardrec.trainer.distributed.dist import (
        agree_to_start,
        init_distributed,
        launched_rank,
        launched_world_size,
    )
    from shardrec.trainer.job.preflight import check_rank_job
    from shardrec.trainer.job.sections import DistConfig
    from shardrec.trainer.rundir.checkpoint.folders import check_checkpoint_folders
    from shardrec.trainer.rundir.life import lifecycle
    from shardrec.trainer.rundir.life.continuation import check_continuing_job

    is_main = launched_rank() == 0
    job_config, refusal = None, None
    try:
        job_config = resolve()
        # Every rank reads the run directory before any joins the group: all see the same files
        # (it is on a shared filesystem), so all refuse, or stop at a complete run, together,
        # and rank 0 cannot have written this invocation's config.toml yet.
        continuing = False
        if direct:  # before what the checkpoints say: `shardrec train` checked it before its ranks
            check_checkpoint_folders(out_dir)
        if continue_on is not None:
            complete, continuing = check_continuing_job(out_dir, job_config, allow_change)
        else:
            complete = lifecycle.check_job(out_dir, job_config, allow_change)
        if direct:  # a direct torchrun: no `shardrec train` checked the job against its data
            check_rank_job(job_config, launched_world_size())
    except ValueError as e:
        refusal = _refusal_line(e, job_config, direct)
    try:
        # A direct torchrun's nodes each read their own flags and data: a refusal on one reaches
        # the others before they join (under `shardrec train` every rank refuses alike).
        dist_cfg = job_config.dist if job_config is not None else DistConfig()
        refused_elsewhere = agree_to_start(refusal, dist_cfg.timeout_s) if direct else None
        if refusal is not None or refused_elsewhere is not None:
            exit_refused(refusal or refused_elsewhere)
        env = init_distributed(job_config.train.device, dist_cfg.timeout_s, dist_cfg.bind_cores)
        # Each node read its own flags, data and run directory: before any rank acts on them
        # (a complete run too: a node that saw another directory would wait for the others).
        _check_nodes_agree(job_config, out_dir, env)
        if complete is not None:
            if is_main:
                print(complete, file=sys.stderr)
            return None
    except ValueError as e:
        exit_refused(_refusal_line(e, job_config, direct))
    return job_config, continuing, env


def _refusal_line(error: ValueError, job_config: JobConfig | None, direct: bool) -> str:
    """A direct launch's own flags say where a setting was given, as `shardrec train` says it (a
    launcher's resolved job file is no file the user wrote)."""
    return job_config.located(str(error)) if direct and job_config is not None else str(error)


def _check_nodes_agree(job_config: JobConfig, out_dir: Path, env: DistEnv) -> None:
    """ValueError, the same line on every rank, unless every rank sees the run directory rank 0
    writes in, the same data and the same settings and plan (trainer.rundir.life.node_agreement).
    """
    import uuid

    import torch.distributed as dist

    from shardrec.trainer.rundir import names
    from shardrec.trainer.rundir.life.node_agreement import disagreement, rank_view

    if env.world_size == 1:
        return
    marker = out_dir / f"{names.NODE_MARKER}{uuid.uuid4().hex}" if env.is_main else None
    if marker is not None:
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            marker.touch()
        except OSError:
            marker = None  # rank 0 cannot write there: its run directory says so as it starts
    views: list[Any] = [None] * env.world_size
    dist.all_gather_object(views, rank_view(job_config, out_dir, marker.name if marker else ""))
    # Rank 0's marker was written before it joined the gather: each rank looks for it now.
    seen = [False] * env.world_size
    dist.all_gather_object(seen, not views[0].marker or (out_dir / views[0].marker).is_file())
    if marker is not None:
        marker.unlink(missing_ok=True)
    problem = disagreement(views, seen)
    if problem:
        raise ValueError(problem)


def _train(
    job_config: JobConfig, env: DistEnv, out_dir: Path, stop: StopRequest, continuing: bool
) -> dict:
    """Train the job in the joined group and return its summary; a failure exits the way the
    launcher reads it (a refusal's one line, a lost peer, a bug's traceback)."""
    from shardrec.trainer.distributed.dist import RankMissing, shutdown
    from shardrec.trainer.distributed.launch import launcher_job_id
    from shardrec.trainer.loop.job_run import run_job
    from shardrec.trainer.loop.steps import NonFiniteLossError
    from shardrec.trainer.loop.train_job import build_job
    from shardrec.trainer.rundir.lock import acquire_run_lock

    try:
        # Held by rank 0 until this process ends, however it ends (see trainer.rundir.lock).
        lock = acquire_run_lock(out_dir, launcher_job_id()) if env.is_main else None  # noqa: F841
        plan = job_config.sharding.plan or None
        return run_job(build_job(job_config, env, out_dir, plan, stop, continuing=continuing))
    except (ValueError, NonFiniteLossError) as e:  # the launcher shows it as the one line
        exit_refused(str(e))
    except RankMissing as e:
        # A barrier that failed because a rank died names that death only as a consequence.
        report_failure(str(e), consequence=peer_gone(e))
        print(f"error: {e}", file=sys.stderr)
        shutdown()
        raise typer.Exit(1) from None
    except Exception as e:  # a bug or a failed collective
        if peer_gone(e):  # another rank died first: one line here, the launcher names that rank
            exit_after_peer_loss(e)
        # Its traceback follows; its line goes to the launcher.
        report_failure(f"{type(e).__name__}: {e}")
        if env.device.type == "cuda":
            exit_after_cuda_failure()
        raise


def main() -> None:
    typer.run(rank_main)
