"""The flags of a training run, defined once.

`shardrec train` (tools/cli/train.py) takes them and passes them on, through torchrun, to every
rank's `python -m shardrec.trainer` (trainer/loop/train_entry.py), which takes the same ones. A flag that
stands for a job setting shows that setting's docstring (trainer/job/config.py) as its help.
Imports only typer and the config: the CLI's start-up must not pay for torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from shardrec.trainer.job.config import DataConfig, ShardingConfig, TrainConfig, field_help


def _setting_help(cls: type, key: str, dotted: str) -> str:
    return f"{field_help(cls)[key].rstrip('.')}; sets {dotted}."


DEFAULT_OUT_DIR = Path("runs/train")

ConfigFlag = Annotated[Path | None, typer.Option("--config", help="TOML job file (defaults: trainer/job/config.py).")]
DataFlag = Annotated[Path | None, typer.Option("--data", help=_setting_help(DataConfig, "path", "data.path"))]
PlanFlag = Annotated[Path | None, typer.Option("--plan", help=_setting_help(ShardingConfig, "plan", "sharding.plan"))]
OutDirFlag = Annotated[
    Path, typer.Option("--out-dir", help="Run directory: metrics, checkpoints, resolved config, plan.")
]
StepsFlag = Annotated[int | None, typer.Option("--steps", help=_setting_help(TrainConfig, "steps", "train.steps"))]
SetFlag = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Override a job setting, KEY as section.key (e.g. train.seed=1); repeat for several.",
    ),
]

AllowChangeFlag = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-change",
        metavar="KEY",
        help="Let a resume change this setting (section.key, or a whole section); repeat for several. "
        "train.steps and train.epochs may always change; the dataset never.",
    ),
]


def rank_args(
    *,
    config: Path | None,
    data: Path | None,
    plan: Path | None,
    out_dir: Path,
    steps: int | None,
    overrides: list[str],
    allow_change: Sequence[str] = (),
) -> list[str]:
    """The arguments of every rank's `python -m shardrec.trainer` for these flag values."""
    args = ["--out-dir", str(out_dir)]
    for flag, value in (("--config", config), ("--data", data), ("--plan", plan), ("--steps", steps)):
        if value is not None:
            args += [flag, str(value)]
    for item in overrides:
        args += ["--set", item]
    # The ranks check the run directory again (a direct torchrun has no `shardrec train` before it).
    for key in allow_change:
        args += ["--allow-change", key]
    return args
