"""The rank entry's warning filter and the train flags that `shardrec train` and the ranks share."""

from __future__ import annotations

import ast
import typing
import warnings
from pathlib import Path

import typer
from typer.testing import CliRunner

# At module level: typer resolves the annotations of `rank` below in this module's namespace.
from shardrec.trainer.job.flags import (
    AllowChangeFlag,
    ConfigFlag,
    DataFlag,
    OutDirFlag,
    PlanFlag,
    SetFlag,
    StepsFlag,
    rank_args,
)


def test_only_the_known_harmless_warnings_are_hidden() -> None:
    from shardrec.trainer.distributed.rank_process import ignore_known_warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ignore_known_warnings()
        warnings.warn(
            "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead.", FutureWarning, stacklevel=2
        )
        warnings.warn("Please use DTensor instead and we are deprecating ShardedTensor.", FutureWarning, stacklevel=2)
        warnings.warn("some indices are out of range [0, 50)", UserWarning, stacklevel=2)  # shaped like fbgemm's
        warnings.warn("a change of behaviour in the next release", FutureWarning, stacklevel=2)
    assert [str(w.message) for w in seen] == [
        "some indices are out of range [0, 50)",
        "a change of behaviour in the next release",
    ]


def test_flags_that_set_a_job_setting_show_its_docstring() -> None:
    from shardrec.trainer.job import flags
    from shardrec.trainer.job.config import TrainConfig, field_help

    option = typing.get_args(flags.StepsFlag)[1]
    assert option.help == f"{field_help(TrainConfig)['steps'].rstrip('.')}; sets train.steps."
    assert field_help(TrainConfig)["steps"] == "Stop after this many steps (0: run the epochs)."


def test_the_ranks_parse_what_shardrec_train_passes_them(tmp_path: Path) -> None:
    parsed = {}

    def rank(
        config: ConfigFlag = None,
        data: DataFlag = None,
        plan: PlanFlag = None,
        out_dir: OutDirFlag = Path("x"),
        steps: StepsFlag = None,
        set_: SetFlag = None,
        allow_change: AllowChangeFlag = None,
    ) -> None:
        parsed.update(
            config=config, data=data, plan=plan, out_dir=out_dir, steps=steps, overrides=set_, allow=allow_change
        )

    args = rank_args(
        config=tmp_path / "job.toml",
        data=tmp_path / "data",
        plan=None,
        out_dir=tmp_path / "run",
        steps=7,
        overrides=["train.seed=3", 'data.tail="pad"'],
        allow_change=["optim.dense_lr", "train"],
    )
    app = typer.Typer()
    app.command()(rank)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert parsed == {
        "config": tmp_path / "job.toml",
        "data": tmp_path / "data",
        "plan": None,
        "out_dir": tmp_path / "run",
        "steps": 7,
        "overrides": ["train.seed=3", 'data.tail="pad"'],
        "allow": ["optim.dense_lr", "train"],
    }


def test_the_rank_entry_takes_every_train_flag_and_eval_ranks_use_its_public_helpers() -> None:
    """The rank program parses --allow-change (it checks the run directory itself), and both rank
    programs (training's and eval's) share one logging set-up and exit (trainer.distributed.rank_process)
    through public names, not private ones."""
    import inspect

    from shardrec.trainer.inference import eval_entry
    from shardrec.trainer.loop import train_entry as entry

    assert "allow_change" in inspect.signature(entry.rank_main).parameters
    for module in (entry, eval_entry):
        tree = ast.parse(Path(module.__file__).read_text())
        imported = [(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names]
        assert ("shardrec.trainer.distributed.rank_process", "configure_rank_logging") in imported, module
        assert ("shardrec.trainer.distributed.rank_process", "exit_cleanly") in imported, module
        assert [name for _, name in imported if name.startswith("_")] == [], module
