"""The flags of a training run, defined once, and the one way they become a JobConfig.

`shardrec train` (tools/cli/train.py) and the rank program `python -m shardrec.trainer`
(trainer/loop/train_entry.py) take the same flags. `shardrec train` resolves them into a
JobConfig once (`job_from_flags`) and hands its ranks that resolved job as one file (`--job`,
the TOML of JobConfig.to_toml); a rank started by torchrun directly (several nodes) resolves the
flags itself, the same way. A flag that stands for a job setting shows that setting's docstring
(trainer/job/sections.py, model_section.py) as its help. Imports only typer and the config: the CLI's start-up must
not pay for torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from shardrec.trainer.job.config import JobConfig, load_job_config
from shardrec.trainer.job.sections import DataConfig, ShardingConfig, TrainConfig
from shardrec.trainer.job.toml_values import field_help, toml_value


def _setting_help(cls: type, key: str, dotted: str) -> str:
    return f"{field_help(cls)[key].rstrip('.')}; sets {dotted}."


DEFAULT_OUT_DIR = Path("runs/train")

ConfigFlag = Annotated[
    Path | None,
    typer.Option("--config", help="TOML job file (its defaults: `shardrec config defaults`)."),
]
JobFlag = Annotated[
    Path | None,
    typer.Option(
        "--job",
        help="The resolved job (TOML) that `shardrec train` writes for its ranks; given alone, without "
        "--config, --data, --plan, --steps or --set.",
    ),
]
DataFlag = Annotated[
    Path | None, typer.Option("--data", help=_setting_help(DataConfig, "path", "data.path"))
]
# A string, not a Path: Path("") is Path("."), and `--plan ''` means "plan at start-up".
PlanFlag = Annotated[
    str | None,
    typer.Option(
        "--plan",
        metavar="<path>",
        help=_setting_help(ShardingConfig, "plan", "sharding.plan"),
    ),
]
OutDirFlag = Annotated[
    Path,
    typer.Option("--out-dir", help="Run directory: metrics, checkpoints, resolved config, plan."),
]
StepsFlag = Annotated[
    int | None, typer.Option("--steps", help=_setting_help(TrainConfig, "steps", "train.steps"))
]
SetFlag = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Override a job setting, KEY as section.key (e.g. train.seed=1); repeat for several. "
        "data.path, sharding.plan and train.steps are given by --data, --plan, --steps or --set, "
        "not both.",
    ),
]

AllowChangeFlag = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-change",
        metavar="KEY",
        help="Let a resume change this setting (section.key, or a whole section); repeat for several. "
        "Without it, train.steps and train.epochs may change when the run ends no earlier for it, "
        "and the plan and settings that change no result (logging, checkpointing, timeouts, "
        "data.num_workers) always; other data never resumes.",
    ),
]

ContinueOnFlag = Annotated[
    Path | None,
    typer.Option(
        "--continue-on",
        metavar="DATA",
        help="Go on training the run in --out-dir on this data (the next day's), as a new stretch: "
        "the model, optimizers and id maps as the run left them, the new data from its start; "
        "evaluated on it first (progressive validation). Without --config, the run's own settings.",
    ),
]


def entry_overrides(
    data: Path | None, plan: Path | str | None, steps: int | None
) -> list[tuple[str, str]]:
    """The --set items that the --data/--plan/--steps flags stand for (flags win over --set), each
    with the flag as typed (for errors)."""
    out = []
    if data is not None:
        out.append((f"data.path={toml_value(str(data))}", f"--data {data}"))
    if plan is not None:
        shown = str(plan) or "''"
        out.append((f"sharding.plan={toml_value(str(plan))}", f"--plan {shown}"))
    if steps is not None:
        out.append((f"train.steps={steps}", f"--steps {steps}"))
    return out


def job_from_flags(
    config: Path | None,
    data: Path | None,
    plan: Path | str | None,
    steps: int | None,
    overrides: Sequence[str],
) -> JobConfig:
    """The job these flags describe: the job file, then --set, then --data/--plan/--steps.
    ValueError (one line) for a bad file, key or value, and for a key given both by its flag and
    by --set (which of two values the user meant, no rule of precedence can tell)."""
    flagged = entry_overrides(data, plan, steps)
    set_keys = {item.partition("=")[0].strip(): item for item in overrides}
    for item, typed in flagged:
        key = item.partition("=")[0]
        if key in set_keys:
            raise ValueError(f"{typed} and --set {set_keys[key]!r} both set {key}: give one")
    return load_job_config(config, [*overrides, *flagged])


def rank_job(
    job: Path | None,
    config: Path | None,
    data: Path | None,
    plan: Path | str | None,
    steps: int | None,
    overrides: Sequence[str],
    continue_on: Path | None = None,
) -> JobConfig:
    """A rank's job: the resolved one its launcher wrote (`job`), or, started by torchrun
    directly, the one its own flags describe (`continue_on` is then its data). ValueError when
    both are given."""
    if job is None:
        if continue_on is not None and data is not None and data != continue_on:
            raise ValueError(
                f"--data {data} and --continue-on {continue_on}: the run goes on with one dataset"
            )
        return job_from_flags(config, continue_on or data, plan, steps, overrides)
    given = [
        flag
        for flag, value in (
            ("--config", config),
            ("--data", data),
            ("--plan", plan),
            ("--steps", steps),
        )
        if value is not None
    ]
    if overrides:
        given.append("--set")
    if given:
        raise ValueError(
            f"--job {job} is the whole resolved job: give it without {', '.join(given)}"
        )
    return load_job_config(job)


def rank_args(
    job: Path, out_dir: Path, allow_change: Sequence[str] = (), continue_on: Path | None = None
) -> list[str]:
    """The arguments of every rank's `python -m shardrec.trainer` for the resolved job in the file
    `job` (whose data.path is `continue_on`'s when the run goes on)."""
    args = ["--job", str(job), "--out-dir", str(out_dir)]
    if continue_on is not None:
        args += ["--continue-on", str(continue_on)]
    # The ranks check the run directory again (a direct torchrun has no `shardrec train` before it).
    for key in allow_change:
        args += ["--allow-change", key]
    return args


def dataset_error(
    job: JobConfig, message: str, flag: str | None = None, plan_typed: bool = False
) -> str:
    """`message` of a check of `job`, located (JobConfig.located); one about the dataset
    directory itself ('DIR: does not exist', 'DIR: not a directory', ...) is said of what named
    it: `flag` as typed ('--data DIR: does not exist'), else data.path where it was set
    ('job.toml:2: data.path = 'DIR': does not exist'); one about the plan file, where
    sharding.plan was set, unless typed as --plan (`plan_typed`). A relative path of a job file or --set that
    names nothing is taken from where the command runs, which the message says."""
    named = [("data.path", job.data.path, flag)]
    if not plan_typed:  # --plan's own refusals name the file as typed
        named.append(("sharding.plan", job.sharding.plan, None))
    for key, path, typed in named:
        if path and message.startswith(f"{path}: "):
            rest = message[len(path) + 2 :]
            if typed:
                return f"{typed} {path}: {rest}"
            if not Path(path).is_absolute() and not Path(path).exists():
                rest += f" (a relative path is taken from where the command runs, {Path.cwd()})"
            return job.located(f"{key} = {path!r}: {rest}")
    return job.located(message)
