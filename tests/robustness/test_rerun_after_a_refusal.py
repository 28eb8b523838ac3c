"""A preprocessing run refused for its input (a malformed row under --strict, more malformed rows
than --max-skipped-fraction allows) keeps its finished tasks for the same command, and the command
run again once the input is fixed starts over in the same --out, as a user of the usual scripts
reruns it. Before, that rerun was refused: "error: out: holds a run with different inputs; remove
the directory or choose another --out", exit 1. A run stopped by Ctrl-C keeps that refusal: its
finished tasks are for its own input, which a rerun never mixes with another."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from helpers import assert_one_line_error, cli

from shardrec.tools.preprocess import pipeline

FLAGS = ("--max-ids", "300", "--chunk-mb", "0.1")


def _dataset(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".work" not in p.parts
    }


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict[str, bytes]]:
    """A Criteo file's text, and the dataset it gives."""
    root = tmp_path_factory.mktemp("good")
    cli("synth", root / "raw", "--rows", "3000")
    text = (root / "raw" / "train.txt").read_bytes()
    log = root / "in" / "train.txt"  # the dataset records its input's path: the tests' own
    log.parent.mkdir()
    log.write_bytes(text)
    cli("preprocess", log, "--out", root / "out", *FLAGS)
    return text, _dataset(root / "out")


def _broken(text: bytes, lines: range) -> bytes:
    rows = text.split(b"\n")
    for i in lines:
        rows[i] = b"oops"
    return b"\n".join(rows)


@pytest.mark.parametrize(
    ("broken", "flags", "error"),
    [
        (range(1500, 1501), ("--strict",), r"^error: .*train\.txt:1501: row: 1 fields, "),
        (range(100, 200), (), r"^error: .*100 of 3,000 lines malformed \(3\.33%"),
    ],
    ids=["strict", "too many malformed rows"],
)
def test_the_command_run_again_on_the_fixed_input_starts_over(
    good: tuple[bytes, dict[str, bytes]],
    tmp_path: Path,
    broken: range,
    flags: tuple[str, ...],
    error: str,
) -> None:
    text, want = good
    log, out = tmp_path / "in" / "train.txt", tmp_path / "out"
    log.parent.mkdir()
    log.write_bytes(_broken(text, broken))
    command = ("preprocess", log, "--out", out, *FLAGS, "--workers", "2", *flags)
    assert_one_line_error(cli(*command, ok=False), error)
    # The same command on the same input resumes the run, and is refused again.
    assert_one_line_error(cli(*command, ok=False), error)
    log.write_bytes(text)
    cli(*command)
    assert _dataset(out) == want


def _stop_after_two_tasks(log: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run stopped by Ctrl-C once two tasks finished."""
    run_tasks = pipeline._run_tasks

    def stopped(cfg, todo, *args) -> None:
        run_tasks(cfg, todo[:2], *args)
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(pipeline, "_run_tasks", stopped)
        stop = cli("preprocess", log, "--out", out, *FLAGS, ok=False)
    assert stop.exit_code == 130, stop.output


def test_a_run_stopped_by_ctrl_c_is_not_mixed_with_a_changed_input(
    good: tuple[bytes, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text, want = good
    log, out = tmp_path / "in" / "train.txt", tmp_path / "out"
    log.parent.mkdir()
    log.write_bytes(_broken(text, range(100, 101)))
    _stop_after_two_tasks(log, out, monkeypatch)
    log.write_bytes(text)
    assert_one_line_error(
        cli("preprocess", log, "--out", out, *FLAGS, ok=False),
        rf"^error: {re.escape(str(out))}: holds a run with different inputs \(train\.txt: "
        rf"{len(_broken(text, range(100, 101))):,} bytes, now {len(text):,}\); remove the "
        "directory or choose another --out$",
    )


def _replace_keeping_size_and_time(log: Path, text: bytes) -> None:
    """What `cp -p`, `rsync -t` or `touch -r` leave: other bytes under the old size and time."""
    st = log.stat()
    assert len(text) == st.st_size and text != log.read_bytes()
    log.write_bytes(text)
    os.utime(log, ns=(st.st_atime_ns, st.st_mtime_ns))


def _labels_flipped(text: bytes) -> bytes:
    return b"\n".join(
        bytes([ord("1") + ord("0") - r[0]]) + r[1:] if r else r for r in text.split(b"\n")
    )


def test_a_stopped_run_is_not_mixed_with_an_input_of_the_same_size_and_time(
    good: tuple[bytes, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the rerun resumed (exit 0): the parts of the first two tasks held the stopped run's
    labels, the others the new file's, without a word."""
    text, _ = good
    log, out = tmp_path / "in" / "train.txt", tmp_path / "out"
    log.parent.mkdir()
    log.write_bytes(_labels_flipped(text))
    _stop_after_two_tasks(log, out, monkeypatch)
    _replace_keeping_size_and_time(log, text)
    assert_one_line_error(
        cli("preprocess", log, "--out", out, *FLAGS, ok=False),
        rf"^error: {re.escape(str(out))}: holds a run with different inputs \(train\.txt: other "
        r"content of the same size and modification time\); remove the directory or choose "
        "another --out$",
    )


def test_a_refused_run_starts_over_for_an_input_of_the_same_size_and_time(
    good: tuple[bytes, dict[str, bytes]], tmp_path: Path
) -> None:
    """A run refused for its input, then the input replaced by a corrected copy that kept its size
    and time: before, the rerun resumed, keeping the parts of the refused file's finished tasks
    (other labels) beside the new file's."""
    text, want = good
    log, out = tmp_path / "in" / "train.txt", tmp_path / "out"
    log.parent.mkdir()
    rows = _labels_flipped(text).split(b"\n")
    rows[1500] = b"x" * len(rows[1500])  # malformed, the same size
    log.write_bytes(b"\n".join(rows))
    command = ("preprocess", log, "--out", out, *FLAGS, "--strict")
    assert_one_line_error(cli(*command, ok=False), r"^error: .*train\.txt:1501: row: 1 fields, ")
    _replace_keeping_size_and_time(log, text)
    cli(*command)
    assert _dataset(out) == want
