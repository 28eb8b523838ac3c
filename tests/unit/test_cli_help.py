"""`shardrec --help` lists every command (and `data --help` and `bench --help` every command of
theirs) with the first paragraph of its own help, held here to the command's own; the listing
imports no command module (tests/e2e/test_cli_startup.py checks that in a fresh interpreter)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

from shardrec.tools.cli.app import COMMANDS, SUMMARIES, _LazyCommands, app
from shardrec.tools.cli.bench.bench_app import BenchCommands
from shardrec.tools.cli.data.data_app import DataCommands


def test_the_listing_says_what_each_command_says_of_itself() -> None:
    for group in (_LazyCommands(), DataCommands(), BenchCommands()):
        assert list(group.summaries) == list(group.modules)
        for name in group.modules:
            own = group.get_command(None, name)  # type: ignore[arg-type]
            first = inspect.cleandoc(own.short_help or own.help or "").split("\n\n")[0]
            assert " ".join(first.split()) == group.summaries[name], name
    assert list(SUMMARIES) == list(COMMANDS)
    listed = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "300"})
    assert listed.exit_code == 0
    for name, summary in SUMMARIES.items():
        assert any(line.split("│")[1].split() == [name, *summary.split()]
                   for line in listed.stdout.splitlines() if line.count("│") == 2), name  # fmt: skip


def test_train_help_says_what_steps_count_in_a_run_that_goes_on() -> None:
    shown = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "300"})
    assert shown.exit_code == 0
    text = " ".join(shown.stdout.replace("│", " ").split())
    steps = text.split("--steps <int>", 1)[1][:300]
    assert "with --continue-on, the steps of the new stretch, counted from its first" in steps


def test_allow_change_help_says_a_shorter_run_needs_it() -> None:
    """The help said "train.steps and train.epochs may always change", though a resume with fewer
    steps is refused until --allow-change train.steps (README: "when the run ends no earlier")."""
    from shardrec.trainer.loop.train_entry import rank_main

    ranks = typer.Typer(add_completion=False)
    ranks.command()(rank_main)  # as typer.run builds `python -m shardrec.trainer`
    for shown in (
        CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "300"}),
        CliRunner().invoke(ranks, ["--help"], env={"COLUMNS": "300"}),
    ):
        assert shown.exit_code == 0, shown.output
        text = " ".join(shown.stdout.replace("│", " ").split())
        allow = text.split("--allow-change", 1)[1][:500]
        assert "may always change" not in allow
        assert (
            "Without it, train.steps and train.epochs may change when the run ends no earlier for "
            "it, and the plan and settings that change no result (logging, checkpointing, "
            "timeouts, data.num_workers) always; other data never resumes." in allow
        )


def test_a_groups_listing_shows_each_commands_summary_unbroken() -> None:
    # On a wide terminal each summary is one row: the docstrings' line breaks used to cut them
    # mid-sentence ("vs the memcpy roofline and torchrec's" / "pipe.").
    for group, command, summary in (
        ("bench", "loader", "vs the memcpy roofline and torchrec's pipe."),
        ("spec", "show", "(the built-in Criteo spec where none was given)."),
    ):
        shown = CliRunner().invoke(app, [group, "--help"], env={"COLUMNS": "300"})
        assert shown.exit_code == 0, shown.output
        (row,) = [line for line in shown.stdout.splitlines() if f"│ {command} " in line]
        assert summary in row, shown.stdout


def test_no_commands_help_breaks_a_paragraph_mid_sentence() -> None:
    # Each paragraph of a command's description is one line on a terminal wide enough: the
    # docstrings' own line breaks, kept by typer after the first paragraph, cut sentences on
    # narrower ones (export: "... the model config and the" / "dataset's feature transform").
    paths = _command_paths(_LazyCommands())
    assert ("export",) in paths and ("data", "digest") in paths
    for path in paths:
        shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "2000"})
        assert shown.exit_code == 0, (path, shown.output)
        lines = [line.strip() for line in shown.stdout.splitlines()]
        start = next(i for i, line in enumerate(lines) if line.startswith("Usage:")) + 1
        end = next(i for i, line in enumerate(lines) if line.startswith("╭"))
        text = lines[start:end]
        broken = [(a, b) for a, b in zip(text, text[1:]) if a and b]
        assert broken == [], path


def test_the_readme_sections_a_help_names_exist() -> None:
    """`preprocess --help` sent readers to README section "Event logs", which has another title."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    headings = {line.lstrip("#").strip() for line in readme.splitlines() if line.startswith("#")}
    shown = CliRunner().invoke(app, ["preprocess", "--help"], env={"COLUMNS": "300"})
    text = " ".join(shown.stdout.replace("│", " ").split())
    named = re.findall(r'README, "([^"]+)"', text)
    assert named and [n for n in named if n not in headings] == [], named


def _command_paths(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command below `group`, as typed after `shardrec`."""
    paths = []
    for name in group.list_commands(None):
        command = group.get_command(None, name)
        below = getattr(command, "commands", None)
        paths += _command_paths(command, (*path, name)) if below is not None else [(*path, name)]
    return paths


def test_every_usage_line_names_its_arguments_in_capitals() -> None:
    # typer 0.2x wrote `{run_dir}`, `{file}` and, beside a metavar, `{model} {INPUT}`.
    paths = _command_paths(_LazyCommands())
    assert ("predict",) in paths and ("plan", "show") in paths and ("bench", "hitrate") in paths
    shown = {}
    for path in paths:
        usage = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "300"})
        assert usage.exit_code == 0, (path, usage.output)
        line = next(line for line in usage.stdout.splitlines() if "Usage:" in line)
        shown[path] = line.split("[OPTIONS]", 1)[1].split()
    assert shown[("predict",)] == ["MODEL", "INPUT"] and shown[("runs",)] == ["[ROOT]"]
    assert shown[("preprocess",)] == ["INPUTS..."]
    odd = {
        p: a
        for p, a in shown.items()
        if not all(re.fullmatch(r"\[?[A-Z_]+\]?(\.\.\.)?", w) for w in a)
    }
    assert odd == {}


def test_the_helps_of_preprocess_and_spec_infer_name_parquet_and_rows() -> None:
    """Both read Parquet: preprocess's help named only CSV/TSV, and `spec infer --rows` was
    "Lines read"."""

    def shown(*args: str) -> str:
        done = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "300"})
        assert done.exit_code == 0, done.output
        return " ".join(done.stdout.replace("│", " ").split())

    text = shown("preprocess")
    assert (
        "Criteo's rows, or any CSV, TSV or Parquet file a feature spec (--spec) describes" in text
    )
    assert "or the CSV, TSV or Parquet files a spec describes" in text
    assert "the input's format (CSV, TSV or Parquet)" in text
    rows = shown("spec", "infer").split("--rows", 1)[1][:120]
    assert "Rows read to decide: the first ones (of text or Parquet)." in rows


def test_bench_preprocess_size_help_says_where_a_run_is_too_small() -> None:
    """The help said "generated TSV ... measured at >= 1" while a run under 0.5 GB said it was too
    small (README's threshold), and the file of --parquet is no TSV."""
    done = CliRunner().invoke(app, ["bench", "preprocess", "--help"], env={"COLUMNS": "300"})
    assert done.exit_code == 0, done.output
    text = " ".join(done.stdout.replace("│", " ").split())
    assert (
        "Size of the generated text in GB (with --parquet: the text the file holds); under 0.5 a "
        "run says it is too small to measure; the goals were measured at >= 1." in text
    )
