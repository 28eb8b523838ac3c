"""What `shardrec synth` does to the folder it writes into (README, Failures and trust: Synthetic
data): it never replaces a file it did not write, nor leaves its output of other settings beside
the new one; a rerun of the same command into its own folder works."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import assert_one_line_error, cli

# Each --like, tiny, and the first file it writes.
KINDS = {
    "criteo": (["--rows", "50"], "train.txt"),
    "criteo days": (["--rows", "50", "--days", "2"], "day_0"),
    "drift": (["--like", "drift", "--rows", "600", "--days", "2"], "day_0"),
    "yambda": (["--like", "yambda", "--rows", "400"], "events.parquet"),
    "avazu": (["--like", "avazu", "--rows", "50"], "train.csv"),
    "movielens": (["--like", "movielens", "--rows", "50"], "train.csv"),
}


def files(folder: Path) -> dict[str, bytes]:
    """What `ls` shows of the folder and what each file holds."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if not p.name.startswith(".")}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_file_synth_did_not_write_is_never_replaced(kind: str, tmp_path: Path) -> None:
    args, first = KINDS[kind]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / first).write_text("my precious log\n")
    result = cli("synth", mine, *args, ok=False)
    assert_one_line_error(
        result,
        rf"^error: {re.escape(str(mine / first))}: exists and synth did not write it; write into "
        r"another folder or remove it$",
    )
    assert files(mine) == {first: b"my precious log\n"}


@pytest.mark.parametrize("kind", ["criteo days", "yambda", "movielens"])
def test_a_rerun_of_the_same_command_replaces_its_own_output(kind: str, tmp_path: Path) -> None:
    args, _ = KINDS[kind]
    cli("synth", tmp_path / "raw", *args)
    written = files(tmp_path / "raw")
    cli("synth", tmp_path / "raw", *args)
    assert files(tmp_path / "raw") == written


def test_fewer_days_over_an_earlier_run_are_refused_naming_the_setting(tmp_path: Path) -> None:
    """6 days, then 2 into the same folder would leave day_2 .. day_5 of the first log beside the
    second's: refused, naming what differs, and the first log is left whole."""
    raw = tmp_path / "rawd"
    cli("synth", raw, "--like", "drift", "--rows", "600")
    first = files(raw)
    assert sorted(first) == [f"day_{d}" for d in range(6)]
    result = cli("synth", raw, "--like", "drift", "--rows", "600", "--days", "2", ok=False)
    assert_one_line_error(
        result,
        rf"^error: {re.escape(str(raw))}: holds synth output of other settings \(days 6 in the "
        r"folder, 2 now\): day_0, day_1, day_2 and 3 more; remove those files or write into "
        r"another folder$",
    )
    assert files(raw) == first
    other = cli("synth", raw, "--like", "drift", "--rows", "300", "--seed", "1", ok=False)
    assert_one_line_error(
        other, r"\(rows 600 in the folder, 300 now; seed 0 in the folder, 1 now\)"
    )


def test_more_days_over_a_drifting_log_are_refused_saying_it_cannot_grow(tmp_path: Path) -> None:
    """A user who trained on 6 days asks for a 7th: before, "holds synth output of other settings
    (days 6 in the folder, 7 now; ...) ...; remove those files or write into another folder", as if
    a 7-day log elsewhere went on from this one; its every id differs from day_0 on."""
    raw = tmp_path / "rawd"
    cli("synth", raw, "--like", "drift", "--rows", "600")
    first = files(raw)
    result = cli("synth", raw, "--like", "drift", "--rows", "700", "--days", "7", ok=False)
    assert_one_line_error(
        result,
        rf"^error: {re.escape(str(raw))}: holds the 6-day drifting log of --rows 600 \(day_0 \.\. "
        r"day_5\); --days 7 cannot add days to it: a drifting log draws every day for its --days, "
        r"so a 7-day log is another log \(other ids from day_0 on\) whose day_6 does not follow "
        r"this one; for 7 days of one log, write them at once into another folder \(--days 7 "
        r"--rows 700\) and train from its day_0$",
    )
    assert files(raw) == first
    # What the line says: the 7-day log written apart shares no id with this one's day_0.
    cli("synth", tmp_path / "seven", "--like", "drift", "--rows", "700", "--days", "7")
    ids = [
        {token for token in (folder / "day_0").read_bytes().split() if len(token) == 16}
        for folder in (raw, tmp_path / "seven")
    ]
    assert ids[0] and ids[1] and not ids[0] & ids[1]


def test_the_readme_tours_write_beside_each_other(tmp_path: Path) -> None:
    """Output of other settings under other names is left alone: train.txt, then train.csv, then
    the drifting days, then the event log, all in raw/."""
    raw = tmp_path / "raw"
    for args in (KINDS["criteo"][0], KINDS["movielens"][0], KINDS["drift"][0], KINDS["yambda"][0]):
        cli("synth", raw, *args)
    assert sorted(files(raw)) == [
        "album_item_mapping.parquet", "artist_item_mapping.parquet", "day_0", "day_1",
        "events.parquet", "train.csv", "train.txt",
    ]  # fmt: skip
    # Another like into the same file is other settings too.
    result = cli("synth", raw, *KINDS["avazu"][0], ok=False)
    assert_one_line_error(result, r"\(like movielens in the folder, avazu now\): train.csv;")


def _ctrl_c_once_writing(
    out: Path, name: str, *args: str, ignored: bool = False, sig: int = signal.SIGINT
) -> tuple[int, str, float]:
    """synth in a process group of its own (a shell's job), SIGINT (or `sig`) to the group once
    file `name` is being written; returns its exit code, stderr and seconds from the signal to its
    end. ignored: started with SIGINT ignored, as `cmd &` in a script starts it."""
    job = subprocess.Popen(
        [sys.executable, "-m", "shardrec.tools.cli", "synth", str(out), *args],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored else None,
    )
    deadline = time.monotonic() + 60
    while not (out.is_dir() and any(p.name.startswith(f".{name}.tmp-") for p in out.iterdir())):
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1][-3000:]
        time.sleep(0.02)
    sent = time.monotonic()
    os.killpg(job.pid, sig)
    _, stderr = job.communicate(timeout=60)
    return job.returncode, stderr, time.monotonic() - sent


def test_ctrl_c_stops_synth_at_once_leaving_no_half_file(tmp_path: Path) -> None:
    out = tmp_path / "synbig"
    code, stderr, seconds = _ctrl_c_once_writing(out, "train.txt", "--rows", "600000")
    assert code == 130 and seconds < 3, (code, seconds, stderr[-3000:])
    assert stderr.strip() == (
        f"interrupted: {out}: the files written so far are kept, none half-written; rerun the "
        "same command to finish"
    )
    assert sorted(p.name for p in out.iterdir()) == [".synth.json"]  # no temporary left
    cli("synth", out, "--rows", "2000")  # the rerun finishes it
    assert sorted(files(out)) == ["train.txt"]


def test_synth_started_with_sigint_ignored_keeps_ignoring_it(tmp_path: Path) -> None:
    # A script's `synth ... &` starts so: a Ctrl-C meant for the script's foreground command
    # reaches the job too (one process group), and must not stop it (POSIX); `kill` stops it.
    out = tmp_path / "synbg"
    code, stderr, _ = _ctrl_c_once_writing(out, "train.txt", "--rows", "300000", ignored=True)
    assert (code, stderr) == (0, ""), stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [".synth.json", "train.txt"]
    assert (out / "train.txt").read_bytes().count(b"\n") == 300_000


def test_a_kill_stops_synth_as_ctrl_c_does_leaving_no_half_file(tmp_path: Path) -> None:
    # SIGTERM, how a job started with `&` is stopped, since it ignores Ctrl-C.
    out = tmp_path / "synkill"
    code, stderr, seconds = _ctrl_c_once_writing(
        out, "train.txt", "--rows", "600000", ignored=True, sig=signal.SIGTERM
    )
    assert code == 143 and seconds < 3, (code, seconds, stderr[-3000:])
    assert stderr.strip() == (
        f"interrupted: {out}: the files written so far are kept, none half-written; rerun the "
        "same command to finish"
    )
    assert sorted(p.name for p in out.iterdir()) == [".synth.json"]  # no temporary left


_CTRL_C_WHILE_LOADING = """
import os, runpy, signal, sys

TRIP, STARTED = sys.argv[1:3]

class CtrlC:  # a real SIGINT, sent as the command's modules load (before the command starts)
    def find_spec(self, name, path=None, target=None):
        if name == TRIP:
            os.kill(os.getpid(), signal.SIGINT)

sys.meta_path.insert(0, CtrlC())
sys.argv = ["shardrec", *sys.argv[3:]]
if STARTED == "python -m":  # click then names the program `python -m shardrec.tools.cli`
    runpy.run_module("shardrec.tools.cli", run_name="__main__", alter_sys=True)
else:
    from shardrec.tools.cli.entry import main
    main()
"""
STARTED = pytest.mark.parametrize("started", ["shardrec", "python -m"])
"""How the command is started: the console script, or `python -m shardrec.tools.cli` (before,
its line named the command `-m shardrec.tools.cli synth`)."""


@pytest.mark.parametrize(
    "command, module",
    [
        # A group's command is named as typed: before, 'preprocess had not started', which reads
        # as `shardrec preprocess`.
        (["synth"], "shardrec.tools.synth.criteo"),
        (["bench", "preprocess"], "shardrec.tools.cli.bench.preprocess"),
        # As typer reads the options (it imports pydantic then): before, exit 130 and no line.
        (["synth"], "typer._adapters"),
    ],
)
@STARTED
def test_ctrl_c_while_a_commands_modules_load_is_one_line_and_writes_nothing(
    tmp_path: Path, command: list[str], module: str, started: str
) -> None:
    out = tmp_path / "syn"
    args = [*command, str(out)] if command == ["synth"] else [*command, "--work-dir", str(out)]
    done = subprocess.run(
        [sys.executable, "-c", _CTRL_C_WHILE_LOADING, module, started, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (130, ""), done.stderr[-3000:]
    said = " ".join(command)
    assert done.stderr == f"interrupted: {said} had not started: nothing written\n"
    assert not out.exists()


_CTRL_C_IN_SET_NAME = """
import os, signal, sys

class Arm:  # once the command's module starts loading
    def find_spec(self, name, path=None, target=None):
        if name == "shardrec.tools.cli.synth":
            sys.setprofile(ctrl_c_in_set_name)

def ctrl_c_in_set_name(frame, event, arg):  # a real SIGINT, raised inside a field's __set_name__
    if event == "call" and frame.f_code.co_name == "__set_name__":
        sys.setprofile(None)
        os.kill(os.getpid(), signal.SIGINT)

sys.meta_path.insert(0, Arm())
from shardrec.tools.cli.entry import main
sys.argv = ["shardrec", "synth", *sys.argv[1:]]
main()
"""


def test_ctrl_c_as_a_dataclass_is_made_is_one_line(tmp_path: Path) -> None:
    """Python 3.11 wraps a KeyboardInterrupt raised in __set_name__ (each dataclass field has one)
    in RuntimeError: before, 'RuntimeError: Error calling __set_name__ on 'Field' instance
    '_cells' in 'Column'' (rich's table, imported by synth's module), its traceback, exit 1."""
    out = tmp_path / "syn"
    done = subprocess.run(
        [sys.executable, "-c", _CTRL_C_IN_SET_NAME, str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (130, ""), done.stderr[-3000:]
    assert done.stderr == "interrupted: synth had not started: nothing written\n"
    assert not out.exists()


@pytest.mark.parametrize(
    "command, module",
    [
        # Commands that only read: each imports its module while it runs, so the SIGINT lands
        # inside the command itself, as a Ctrl-C at any later moment would.
        (["data", "digest"], "shardrec.dataloader.loader"),
        (["runs"], "shardrec.trainer.rundir.life.run_state"),
    ],
)
@STARTED
def test_ctrl_c_in_a_command_that_only_reads_ends_in_one_line(
    tiny_dataset: Path, command: list[str], module: str, started: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CTRL_C_WHILE_LOADING, module, started, *command, str(tiny_dataset)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    # Before: exit 130 and nothing at all (typer's own handling of a KeyboardInterrupt).
    assert (done.returncode, done.stdout) == (130, ""), done.stderr[-3000:]
    assert done.stderr == f"interrupted: {' '.join(command)} stopped before it finished\n"


@pytest.mark.parametrize(
    "args, says",
    [
        (["--days", "-1"], "--days must be 0 (one train file) or more, got -1"),
        (["--rows", "2", "--days", "3"], "--rows 2 over 3 days would leave day_2 empty"),
        (
            ["--like", "drift", "--rows", "4"],
            "--rows 4 over 6 days would leave day_4 .. day_5 empty",
        ),
    ],
)
def test_days_synth_cannot_fill_are_refused_before_any_file(args, says, tmp_path: Path) -> None:
    # Before, --days -1 wrote train.txt without a word, and fewer rows than days wrote empty days.
    result = cli("synth", tmp_path / "raw", *args, ok=False)
    assert result.exit_code == 1
    assert result.output.startswith(f"error: {says}") and len(result.output.splitlines()) == 1
    assert not (tmp_path / "raw").exists()


@pytest.mark.parametrize("like", ["avazu", "movielens", "yambda"])
def test_max_vocab_for_a_shape_that_fixes_its_values_is_refused(like: str, tmp_path: Path) -> None:
    # Before, --max-vocab 5 with these shapes wrote the same bytes as without it, without a word.
    result = cli(
        "synth", tmp_path / "raw", "--like", like, "--rows", "300", "--max-vocab", "5", ok=False
    )
    assert_one_line_error(
        result,
        rf"^error: --like {like} fixes its columns' values: --max-vocab is for criteo and drift$",
    )
    assert not (tmp_path / "raw").exists()


def test_max_vocab_bounds_the_criteo_shapes_distinct_values(tmp_path: Path) -> None:
    cli("synth", tmp_path / "raw", "--rows", "400", "--max-vocab", "5")
    rows = [line.split("\t") for line in (tmp_path / "raw" / "train.txt").read_text().splitlines()]
    assert max(len({row[i] for row in rows} - {""}) for i in range(14, 40)) == 5
