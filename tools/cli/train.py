"""`shardrec train`: check the job, run it on N local ranks through torchrun, print the summary."""

from __future__ import annotations

import functools
import json
import signal
import tempfile
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from shardrec.tools.cli.common import (
    counted,
    fail,
    print_json,
    refuse_inside_a_launched_group,
)
from shardrec.tools.cli.train_run_dir import (
    check_apart,
    check_no_misnamed_checkpoint,
    check_resume_checkpoint,
    kept_checkpoint,
    lock_run_dir,
    refused_checkpoint,
)
from shardrec.tools.console import console, err_console
from shardrec.trainer.job import flags
from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.metrics_log import auc_text

if TYPE_CHECKING:
    from shardrec.trainer.distributed.failures import LaunchResult
    from shardrec.trainer.job.config import JobConfig

RestartFlag = Annotated[
    bool,
    typer.Option(
        "--restart",
        help="Start over: move an existing OUT_DIR aside to OUT_DIR.1 (.2, ...) first; nothing is deleted.",
    ),
]


def _print_summary(
    summary: dict, run_dir: Path, earlier: bool = False, typed: Path | None = None
) -> None:
    """The results table, then how this job trained (`earlier`: a finished run's results shown
    again: no job trained now, so no rate and no resume line; `typed`: --continue-on's data as
    the user named it)."""
    table = Table(
        title=f"{run_dir}: {counted(summary['steps'], 'step')} on "
        f"{counted(summary['world_size'], 'rank')}, "
        f"global batch {summary['global_batch_size']}"
    )
    for col in ("split", "AUC", "log loss", "NE", "samples"):
        table.add_column(col, justify="right")
    for split, m in summary["eval"].items():
        table.add_row(
            split, auc_text(m), f"{m['logloss']:.4f}", f"{m['ne']:.4f}", f"{m['samples']:,}"
        )
    console.print(table)
    if earlier:
        return
    rate = summary.get("train_samples_per_s")
    if rate:
        console.print(f"training: {rate:,.0f} samples/s over {summary['train_seconds']:.1f} s")
    step = summary.get("resumed_from_step")
    if summary.get("continued_on"):  # a new stretch, not a resume of the one it trained
        data = typed or summary["continued_on"]
        console.print(f"went on from step {step} with {data}", highlight=False, soft_wrap=True)
    elif step is not None:
        console.print(f"resumed from the checkpoint of step {step}")


def _failure_message(
    result: LaunchResult, out_dir: Path, data: str, changed_before: Collection[str] = ()
) -> str:
    """The last line after a failed run: the cause as the ranks and torchrun's agent reported it,
    the dataset's files that changed (`changed_before`: those found changed before the launch),
    and what a rerun resumes from (when anything)."""
    from shardrec.dataloader.format.integrity import changed_since_written
    from shardrec.trainer.rundir.checkpoint.signature import OTHER_JOB
    from shardrec.trainer.rundir.checkpoint.trust import REFUSED

    parts = [
        f"training failed: {result.cause}"
        if result.cause
        else f"training failed (torchrun exit code {result.code})"
    ]
    changed = changed_since_written(data) if data else []
    for found, when in (
        ([c for c in changed if c in changed_before], "had changed before the run started"),
        ([c for c in changed if c not in changed_before], "changed under the training"),
    ):
        if found:
            more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            parts.append(f"the dataset {when}: {found[0]}{more}")
    # The newest checkpoint refused (its files, or another job's): a rerun meets it again.
    refused = bool(result.cause) and (REFUSED in result.cause or OTHER_JOB in result.cause)
    kept = refused_checkpoint(out_dir) if refused else kept_checkpoint(out_dir)
    return "; ".join(parts + ([kept] if kept else []))


def train(
    config: flags.ConfigFlag = None,
    data: flags.DataFlag = None,
    plan: flags.PlanFlag = None,
    out_dir: flags.OutDirFlag = flags.DEFAULT_OUT_DIR,
    nproc_per_node: Annotated[int, typer.Option(min=1, help="Ranks to start on this machine.")] = 1,
    steps: flags.StepsFlag = None,
    set_: flags.SetFlag = None,
    allow_change: flags.AllowChangeFlag = None,
    continue_on: flags.ContinueOnFlag = None,
    restart: RestartFlag = False,
    max_restarts: Annotated[
        int,
        typer.Option(
            min=0,
            help="Times torchrun restarts the ranks after a failure (each resumes from the last checkpoint).",
        ),
    ] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Train a DLRM, DCNv2 or HSTU model on N local ranks (torchrun); resumes if OUT_DIR holds
    checkpoints; --continue-on DATA goes on training the run on the next data."""
    from shardrec.dataloader.format.integrity import changed_since_written
    from shardrec.trainer.distributed.launch import launch, new_job_id

    refuse_inside_a_launched_group(
        "train",
        nproc_per_node,
        "; on several machines, run `torchrun ... -m shardrec.trainer ...` on each instead",
    )
    overrides, allow = list(set_ or []), list(allow_change or [])
    if continue_on is not None:
        if restart:
            fail(
                "--continue-on goes on with the run in --out-dir; --restart starts it over: not both"
            )
        if data is not None and data != continue_on:
            fail(f"--data {data} and --continue-on {continue_on}: the run goes on with one dataset")
        data = continue_on
        if config is None and (out_dir / names.CONFIG).is_file():
            config = out_dir / names.CONFIG  # the run's own settings, its data replaced
        if plan is None and (out_dir / names.CONFIG).is_file():
            plan = _own_plan(out_dir, config, overrides)
    job_id = new_job_id()
    if data is not None:  # before the lock file lands in the dataset's directory
        try:
            check_apart(out_dir, data)
        except ValueError as e:
            fail(str(e))
    locks = [lock_run_dir(out_dir, job_id, create=False)]  # before anything looks at or moves it
    try:
        if not restart:  # --restart moves the run directory, renamed folder and all
            check_no_misnamed_checkpoint(out_dir)
        job = _prepare_run_dir(
            config,
            data,
            plan,
            steps,
            overrides,
            nproc_per_node,
            out_dir,
            allow,
            restart,
            continue_on is not None,
        )
        if job is None:
            _show_results(out_dir, json_out, earlier=True)  # a finished run's, nothing written
            return
        if (
            locks[0] is None or restart
        ):  # a new directory, or the old one (and its lock file) moved aside
            locks.append(lock_run_dir(out_dir, job_id, create=True))
        check_resume_checkpoint(out_dir)
        _end_if_stopped_before_launch()
        # A failed run's last line tells these from the files changed while it trained.
        changed_before = changed_since_written(job.data.path)
        # The ranks take the job resolved here as one file, not the flags to resolve it again.
        with tempfile.TemporaryDirectory(prefix="shardrec-train-") as tmp:
            job_file = Path(tmp) / "job.toml"
            job_file.write_text(job.to_toml())
            result = launch(
                flags.rank_args(
                    job_file, out_dir, allow, Path(job.data.path) if continue_on else None
                ),
                nproc_per_node,
                max_restarts,
                job_id=job_id,
                stop_grace_s=job.checkpoint.stop_grace_s,
                notify=lambda line: err_console.print(line, highlight=False, soft_wrap=True),
            )
        if result.forced:  # while the lock is held: no other job is writing metrics.jsonl
            from shardrec.trainer.rundir.life import run_state

            run_state.record_stop_at_once(out_dir, result.forced)
    finally:
        # Every way out (a refusal, a finished run) drops the lock: an in-process caller may train
        # again.
        for lock in locks:
            if lock is not None:
                lock.release()
    _end_of_job(result, out_dir, job.data.path, changed_before)
    _show_results(out_dir, json_out, typed=continue_on)


def _end_of_job(result: LaunchResult, out_dir: Path, data: str, changed_before: list[str]) -> None:
    """Say how a job that did not complete ended, in one line, and exit with its code."""
    from shardrec.trainer.rundir.life import run_state

    if result.forced:
        kept = kept_checkpoint(out_dir) or "no checkpoint was written"
        err_console.print(f"{result.forced}; {kept}", highlight=False, soft_wrap=True)
        raise typer.Exit(128 + signal.Signals[result.signal or "SIGTERM"].value)
    if result.code != 0:
        fail(_failure_message(result, out_dir, data, changed_before))
    run = run_state.read_run_dir(out_dir)
    if run.stop is not None and run.stop.get("step") is not None:
        # asked to stop (here, or by a signal to the ranks themselves)
        err_console.print(
            run_state.stopped_message(run.stop["step"]), highlight=False, soft_wrap=True
        )
        raise typer.Exit(run_state.STOPPED_EXIT_CODE)


def _end_if_stopped_before_launch() -> None:
    """A SIGTERM/SIGINT during the checks before the launch starts no rank (they would start only
    to stop, ~10 s later) and ends as a stop does: what the checks wrote is kept."""
    from shardrec.trainer.distributed.launch import stop_requested
    from shardrec.trainer.rundir.life import run_state

    name = stop_requested()
    if name is not None:
        err_console.print(
            f"{name} before the ranks started: none started, nothing trained; "
            "rerun the same command to go on",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(run_state.STOPPED_EXIT_CODE)


def _own_plan(out_dir: Path, config: Path | None, overrides: list[str]) -> str | None:
    """The run's own copy of its plan (continuation.own_plan), or one line; None where a job file
    other than the run's own, or a --set, names sharding.plan (the stretch takes that one)."""
    from shardrec.trainer.job.config import load_job_config
    from shardrec.trainer.rundir.life.continuation import own_plan

    if any(item.partition("=")[0].strip() == "sharding.plan" for item in overrides):
        return None
    try:
        if config not in (None, out_dir / names.CONFIG) and load_job_config(config).sharding.plan:
            return None
        return own_plan(out_dir)
    except ValueError as e:
        fail(str(e))


def _prepare_run_dir(
    config: Path | None,
    data: Path | None,
    plan: str | None,
    steps: int | None,
    overrides: list[str],
    world_size: int,
    out_dir: Path,
    allow: list[str],
    restart: bool,
    continuing: bool = False,
) -> JobConfig | None:
    """Resolve and check the job and what OUT_DIR holds before any rank starts; returns the job,
    or None if the run (with `continuing`: its stretch on this data) is already complete."""
    from shardrec.dataloader.format.manifest import Manifest
    from shardrec.trainer.distributed.devices import crowded_cpu_ranks
    from shardrec.trainer.job.mlperf_rules import rule_breaks
    from shardrec.trainer.rundir.life import lifecycle, resume_settings, run_state
    from shardrec.trainer.rundir.life.continuation import (
        check_continue,
        check_no_unfinished_stretch,
        complete_stretch_message,
        new_stretch_length,
    )
    from shardrec.trainer.rundir.life.stretches import kept_stretch_steps

    job, state = None, "new"
    try:
        # Flags, settings and the dataset first: a bad value is one line before torch is imported
        # (preflight).
        resume_settings.check_allow_keys(allow)
        job = flags.job_from_flags(config, data, plan, steps, overrides)
        if not continuing and not restart:
            check_no_unfinished_stretch(out_dir, job.data.path)
        if job.data.path:
            check_apart(out_dir, Path(job.data.path))
        manifest = Manifest.load(job.data.path) if job.data.path else None
        if continuing and manifest is not None:  # whether the run may go on with it, first
            state = check_continue(out_dir, job, manifest, allow)
            if state == "continue" and config == out_dir / names.CONFIG:
                job = new_stretch_length(out_dir, job, manifest, steps, overrides)
        from shardrec.trainer.job.preflight import (
            empty_eval_splits,
            preflight,
            unbounded_shortfalls,
        )

        # A resume goes on with its stretch's update spacing (the checkpoint's), a new one its own.
        resumes = not restart and (not continuing or state == "resume")
        kept = kept_stretch_steps(out_dir) if resumes else None
        kind = preflight(job, world_size=world_size, stretch_steps=kept)
        manifest = manifest or Manifest.load(job.data.path)
        notes = unbounded_shortfalls(job, manifest, continuing)
        notes += rule_breaks(job, manifest.options.get("multihot"))
        notes += filter(None, [crowded_cpu_ranks(kind, world_size)])
        for line in [*notes, *empty_eval_splits(job, manifest)]:
            err_console.print(f"warning: {line}", highlight=False, soft_wrap=True)
        if not continuing:
            state = "new" if restart else lifecycle.check_run_dir(out_dir, job, manifest, allow)
    except ValueError as e:  # a setting's error: its line; the dataset's: its flag's or key's
        typed = None if data is None else "--continue-on" if continuing else "--data"
        fail(str(e) if job is None else flags.dataset_error(job, str(e), typed, plan is not None))
    if restart:
        if out_dir.is_dir() and not lifecycle.looks_like_run(out_dir):
            fail(
                f"--restart: {out_dir} holds files but no run (no config.toml, metrics.jsonl or "
                "checkpoints/) and would be moved aside whole; give the run a directory of its own"
            )
        moved = lifecycle.move_aside(out_dir)
        if moved is not None:
            err_console.print(
                f"moved the earlier run {out_dir} to {moved}", highlight=False, soft_wrap=True
            )
    if state == "complete":
        message = (
            complete_stretch_message(out_dir, job)
            if continuing
            else lifecycle.complete_message(out_dir, job, run_state.read_run_dir(out_dir))
        )
        err_console.print(message, highlight=False, soft_wrap=True)
        return None
    return job


def _show_results(
    out_dir: Path, json_out: bool, earlier: bool = False, typed: Path | None = None
) -> None:
    """The plan first and the results last, so that they stay on screen (`earlier`: those of a
    run that was already complete; `typed`: --continue-on's data as named)."""
    summary = json.loads((out_dir / names.SUMMARY).read_text())
    if json_out:
        print_json(summary)
        return
    from shardrec.sharding.plan.plan_file import load_plan
    from shardrec.sharding.plan.report import tables_table

    plan, metrics = out_dir / names.PLAN, out_dir / names.METRICS
    console.print(tables_table(load_plan(plan)))
    _print_summary(summary, out_dir, earlier, typed)
    console.print(
        f"plan: {plan} (`shardrec plan show {plan}`); metrics: {metrics} (`shardrec report {out_dir}`)",
        highlight=False,
        soft_wrap=True,
    )


def _taking_stop_requests(command: Callable[..., None]) -> Callable[..., None]:
    """`command`, with SIGTERM/SIGINT a stop request from its first line to its last
    (trainer.distributed.launch.stop_requests)."""

    @functools.wraps(command)
    def wrapped(*args: Any, **kwargs: Any) -> None:
        from shardrec.trainer.distributed.launch import stop_requests

        with stop_requests():
            command(*args, **kwargs)

    return wrapped


def register(app: typer.Typer) -> None:
    app.command(name="train")(_taking_stop_requests(train))
