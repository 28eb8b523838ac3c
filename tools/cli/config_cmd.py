"""`shardrec config show | defaults`: the job settings a run would use, and where they come from."""

from __future__ import annotations

import dataclasses

import typer

from shardrec.tools.cli.common import fail
from shardrec.trainer.job.flags import ConfigFlag, SetFlag

config_app = typer.Typer(
    help="Show the effective job settings (defaults < job file < --set) or the defaults.",
    no_args_is_help=True,
)


@config_app.command("show")
def show(config: ConfigFlag = None, set_: SetFlag = None) -> None:
    """Print the resolved job file: defaults, then --config, then each --set (what `train` would run
    with, as its run directory's config.toml records it: data.path and sharding.plan absolute, an
    unset train.seed as 0 unless train.mlperf_log draws one per run)."""
    from shardrec.trainer.job.config import load_job_config
    from shardrec.trainer.rundir.life.resume_settings import with_absolute_paths

    try:
        job = with_absolute_paths(load_job_config(config, list(set_ or [])))
    except ValueError as e:
        fail(str(e))
    if not job.train.mlperf_log:
        job = dataclasses.replace(
            job, train=dataclasses.replace(job.train, seed=job.train.fixed_seed)
        )
    typer.echo(job.to_toml(), nl=False)


@config_app.command("defaults")
def defaults() -> None:
    """Print every setting's default as a job file, each with its help as a comment."""
    from shardrec.trainer.job.config import JobConfig

    typer.echo(JobConfig().to_toml(comments=True), nl=False)


def register(app: typer.Typer) -> None:
    app.add_typer(config_app, name="config")
