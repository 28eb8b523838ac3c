"""`shardrec preprocess --help` shows each setting's docstring and default: the settings'
dataclasses (PreprocessConfig, Schema) are the one home of both, as trainer/job/sections.py is for
train."""

from __future__ import annotations

import dataclasses

import typer

from shardrec.tools.cli.app import app
from shardrec.tools.preprocess.parse.criteo_text import Schema
from shardrec.tools.preprocess.settings import PreprocessConfig
from shardrec.trainer.job.toml_values import field_help


def _params() -> dict[str, object]:
    group = typer.main.get_command(app)
    # The app loads a command's module when it is asked for (tools/cli/app.py), so ask for it.
    command = group.get_command(typer.Context(group), "preprocess")  # type: ignore[attr-defined]
    return {p.name: p for p in command.params}


def test_every_setting_option_shows_its_docstring_and_default() -> None:
    helps = {**field_help(Schema), **field_help(PreprocessConfig)}
    defaults = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
        for cls in (Schema, PreprocessConfig)
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    params = _params()
    shared = [name for name in helps if name in params]
    assert len(shared) >= 18, shared  # every option that stands for a setting
    for name in shared:
        assert params[name].help.startswith(" ".join(helps[name].split())), name
        if name in ("max_ids", "raw_ids"):  # lists, given comma-separated
            assert params[name].default == ",".join(map(str, defaults[name]))
        elif name in defaults and defaults[name] is not None:
            assert params[name].default == defaults[name], name
