"""What every CLI command shares: one way to fail, print JSON and configure logging, and command
groups whose modules are imported only when one of their commands runs."""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import logging
import math
import signal
import sys
from pathlib import Path
from typing import Any, NoReturn

import typer
import typer.core
import typer.main
from rich.markup import escape

from shardrec.dataloader.util.files import atomic_open
from shardrec.tools.cli.stops import Terminated as Terminated
from shardrec.tools.cli.stops import command_as_typed, ctrl_c_unwrapped, stop_exit_code
from shardrec.tools.cli.stops import sigterm_as_ctrl_c as sigterm_as_ctrl_c
from shardrec.tools.console import err_console

_TYPED = "shardrec.typed"
"""The key in click's context meta (which a command's contexts share) of the command as the
user typed it (`data stats`): the line of a Ctrl-C before the command runs names it."""


class LazyGroup(typer.core.TyperGroup):
    """A command group that imports a command's module (`package`.`modules[name]`, whose
    `register(app)` adds it) only when the command runs or shows its own help: `shardrec runs`
    must not pay for torch, nor `data stats` for numba. Its own --help lists `summaries` (each
    command's first paragraph of help: tests/unit/test_cli_help.py holds them to the commands')
    without importing any."""

    package = ""
    modules: dict[str, str] = {}
    summaries: dict[str, str] = {}
    _listing = False

    def list_commands(self, ctx: typer.Context) -> list[str]:
        return list(self.modules)

    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any:
        if cmd_name not in self.modules:
            return None
        if self._listing:
            return typer.core.TyperCommand(cmd_name, help=self.summaries[cmd_name])
        module = f"{self.package}.{self.modules[cmd_name]}"
        return load_command(module, cmd_name, " ".join([*_groups(ctx), cmd_name]))

    def make_context(
        self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any
    ) -> Any:
        groups = [*_groups(parent), info_name or ""] if parent is not None else []
        typed = command_as_typed(groups, args, self.modules)
        try:
            with ctrl_c_unwrapped():
                ctx = super().make_context(info_name, args, parent, **extra)
        except KeyboardInterrupt:  # as typer reads the options: it imports pydantic then (0.1 s)
            interrupted(f"{typed} had not started: nothing written")
        ctx.meta[_TYPED] = typed
        return ctx

    def invoke(self, ctx: typer.Context) -> Any:
        """A Ctrl-C before the command's own function runs (as the group's callback sets up
        logging, or the command's options are read) is one line too: before, exit 130 and no
        word (typer's own handling). The command's function says its own (load_command)."""
        try:
            with ctrl_c_unwrapped():
                return super().invoke(ctx)
        except KeyboardInterrupt:
            interrupted(f"{ctx.meta.get(_TYPED, 'shardrec')} had not started: nothing written")

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


def _groups(ctx: typer.Context | None) -> list[str]:
    """The groups below the program's own name, as typed (none where no context is given).

    Not `ctx.command_path` less its first word: under `python -m shardrec.tools.cli` click names
    the program `python -m shardrec.tools.cli`, and a Ctrl-C said `interrupted: -m
    shardrec.tools.cli synth had not started`."""
    names = []
    while ctx is not None and ctx.parent is not None:  # the root's name is the program's
        names.append(ctx.info_name)
        ctx = ctx.parent
    return names[::-1]


@functools.cache
def load_command(module_name: str, name: str, said: str = "") -> Any:
    """The click command `name` that the module's register(app) adds; `said`: the command as the
    user typed it (a group's: `bench preprocess`), if not `name`. A Ctrl-C as the module loads
    is the group's to say (LazyGroup.invoke), naming the command as typed: before, a group's
    module said only `interrupted: data had not started` of `shardrec data stats`."""
    module = importlib.import_module(module_name)
    holder = typer.Typer(pretty_exceptions_enable=False, add_completion=False)
    module.register(holder)
    command = typer.main.get_group(holder).commands[name]
    _one_line_summaries(command)
    _one_line_paragraphs(command)
    _one_line_when_stopped(command, said or name)
    return command


def _one_line_when_stopped(command: Any, said: str) -> None:
    """A Ctrl-C that the command does not turn into a line of its own (the commands that only
    read: `data digest`, `data stats`, `runs`, ...) ends in one too, `interrupted: data digest
    stopped before it finished`, exit code 130 (143 for SIGTERM, which the entry point takes as
    Ctrl-C): typer's own handling exits 130 without a word. A group's commands are wrapped too
    (`spec infer`, `plan show`, `config defaults`; a lazy group's, `data` and `bench`, as they
    load)."""
    for name, sub in getattr(command, "commands", {}).items():
        _one_line_when_stopped(sub, f"{said} {name}")
    callback = command.callback
    if callback is None:
        return

    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            with ctrl_c_unwrapped():
                return callback(*args, **kwargs)
        except KeyboardInterrupt:
            interrupted(f"{said} stopped before it finished")

    command.callback = run


def _one_line_summaries(command: Any) -> None:
    """A group's listing (`shardrec bench --help`) shows each command's first paragraph with its
    docstring's line breaks, which broke sentences mid-line ("... and torchrec's / pipe."): give
    each the paragraph as one line (its short help), for the panel to wrap."""
    for sub in getattr(command, "commands", {}).values():
        if sub.short_help is None and sub.help:
            sub.short_help = " ".join(inspect.cleandoc(sub.help).split("\n\n")[0].split())
        _one_line_summaries(sub)


def _one_line_paragraphs(command: Any) -> None:
    """typer's rich help prints a docstring's paragraphs after the first with their line breaks,
    then wraps each line again to the terminal: narrower than the docstring, sentences broke
    mid-line ("... the model config and the" / "dataset's feature transform ..."). Each paragraph
    becomes one line, for the help panel to wrap (one that starts with click's \\b, text meant
    verbatim, is kept as written)."""
    if command.help:
        paragraphs = inspect.cleandoc(command.help).split("\n\n")
        command.help = "\n\n".join(
            p if p.startswith("\b") else " ".join(line.strip() for line in p.split("\n"))
            for p in paragraphs
        )
    for sub in getattr(command, "commands", {}).values():
        _one_line_paragraphs(sub)


def counted(n: int, noun: str) -> str:
    """`1 rank`, `2 ranks`, `1,000 rows`: a count with its noun in the right number."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def fail(message: str) -> NoReturn:
    """End a command on bad user input: one clear line on stderr, exit code 1."""
    # The message is text, not markup: "[trian]" in it must print as written.
    err_console.print(
        f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True, markup=True
    )
    raise typer.Exit(1)


def refuse_inside_a_launched_group(
    command: str, nproc_per_node: int | None, elsewhere: str = ""
) -> None:
    """One line where this process is already one rank of several (torchrun's RANK/WORLD_SIZE),
    for a command that starts ranks of its own: each of those processes would start a job
    (`elsewhere`: what to run instead, after the line's "outside torchrun")."""
    from shardrec.trainer.distributed.dist import launched_rank, launched_world_size

    world = launched_world_size()
    if world > 1:
        rank = launched_rank()
        asked = f" (--nproc-per-node {nproc_per_node})" if nproc_per_node else ""
        fail(
            f"shardrec {command} starts its own ranks{asked}, but this process is already rank "
            f"{rank} of {world} (RANK={rank}, WORLD_SIZE={world} in its environment, as torchrun "
            f"sets them): run shardrec {command} once, outside torchrun{elsewhere}"
        )


def check_out_file(out: Path | None, example: str) -> None:
    """Refuse an --out that names a folder, before any work (`example`: a file name to suggest)."""
    if out is not None and out.is_dir():
        fail(f"--out {out}: is a directory; give a file name such as {out / example}")


def check_not_a_run(out: Path) -> None:
    """Refuse a dataset's --out that holds a training run, before any work: the parts would land
    among the run's files, and `shardrec train --restart` on that run would move them aside."""
    from shardrec.trainer.rundir import names

    found = next(
        (m for m in (names.DATASET_RECORD, names.METRICS, names.CHECKPOINTS) if (out / m).exists()),
        None,
    )
    if found is not None:
        fail(
            f"--out {out} is a run directory (it holds {found}); give the dataset a directory of "
            "its own"
        )


def write_out(out: Path, what: str, write: Any) -> None:
    """Call `write()`, which writes `out`; a failed write (no space or permission, a file where a
    folder should be) ends the command in one line naming the path, not a traceback."""
    try:
        write()
    except OSError as e:
        fail(write_error(out, what, e))


def write_error(out: Path, what: str, e: OSError) -> str:
    """The one line of a failed write of `out` (the `what`), naming the path and the reason."""
    from shardrec.dataloader.util.files import WriteError

    if isinstance(e, WriteError):
        return str(e)
    if e.filename and str(e.filename) != str(out) and Path(e.filename).is_file():
        return f"{out}: cannot write the {what}: {e.filename} is a file, not a folder"
    return f"{out}: cannot write the {what} ({e.strerror or e})"


def interrupted(what: str, by: str | None = None) -> NoReturn:
    """End a command stopped by Ctrl-C (SIGINT): one line saying what is kept and how to go on,
    exit code 130 as a shell gives (typer's own handling prints nothing); 143 where SIGTERM
    stopped it (sigterm_as_ctrl_c). `by`: the signal's name where no exception says which
    (a launcher that took it as a stop request: LaunchResult.signal).

    A command started with SIGINT ignored keeps ignoring it, as Python leaves it: a script's
    `cmd &` (a shell without job control) starts its job so, that a Ctrl-C meant for the script's
    foreground command does not stop it too (POSIX). No command turns it back on.
    """
    if by is not None:
        code = 128 + signal.Signals[by].value
    else:
        code = stop_exit_code()
    err_console.print(
        f"[bold red]interrupted:[/] {escape(what)}", highlight=False, soft_wrap=True, markup=True
    )
    raise typer.Exit(code)


def save_figure(fig: Any, path: Path, dpi: int = 100) -> None:
    """Write a matplotlib figure to `path` (a PNG) atomically (dataloader/util/files.py); close it.

    An unwritable path (no permission, a file where a folder should be, a full disk) ends the
    command with `fail()` naming the path and the reason, not a traceback.
    """
    import matplotlib.pyplot as plt

    try:
        with atomic_open(path) as f:
            fig.savefig(f, format="png", dpi=dpi)
    except OSError as e:
        fail(f"{path}: cannot write the figure ({e.strerror or e})")
    finally:
        plt.close(fig)


def print_json(obj: Any) -> None:
    """`obj` as JSON on stdout; a NaN or infinite float (an AUC of a split of one class) as null:
    bare NaN is no JSON, and jq and JavaScript refuse the whole document for it."""
    sys.stdout.write(json.dumps(_finite(obj), indent=2, default=str, allow_nan=False) + "\n")


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


# Libraries' routine notices, hidden even under -v: fbgemm logs one line per kernel library it
# loads (14 on import) to the root logger.
_LIBRARY_CHATTER = ("Successfully loaded",)
# Warnings the pinned stack prints on every run that are no concern of the user's (shown with -v):
# torch.fx's is_fx_tracing deprecation notice, raised inside torchrec's KeyedJaggedTensor.
_QUIET_WITHOUT_V = ("torch.fx._symbolic_trace",)


def _not_library_chatter(record: logging.LogRecord) -> bool:
    return not (record.levelno < logging.WARNING and str(record.msg).startswith(_LIBRARY_CHATTER))


def configure_logging(verbose: bool = False) -> None:
    """Without -v, warnings and errors only: a command's results are its output, not log lines.
    With -v, shardrec's loggers at DEBUG and other libraries' at INFO, less their chatter."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    # On the root logger itself: fbgemm's records are made there (logging.info), so this filter sees
    # them.
    logging.getLogger().addFilter(_not_library_chatter)
    logging.getLogger("shardrec").setLevel(logging.DEBUG if verbose else logging.WARNING)
    for name in _QUIET_WITHOUT_V:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.ERROR)
