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

from shardrec.dataloader.format.manifest import Manifest
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


def _input(tmp_path: Path, data: bytes) -> tuple[Path, Path]:
    """(the input in/train.txt holding `data`, the --out beside it)."""
    log = tmp_path / "in" / "train.txt"
    log.parent.mkdir()
    log.write_bytes(data)
    return log, tmp_path / "out"


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
    log, out = _input(tmp_path, _broken(text, broken))
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
    log, out = _input(tmp_path, _broken(text, range(100, 101)))
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
    log, out = _input(tmp_path, _labels_flipped(text))
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
    rows = _labels_flipped(text).split(b"\n")
    rows[1500] = b"x" * len(rows[1500])  # malformed, the same size
    log, out = _input(tmp_path, b"\n".join(rows))
    command = ("preprocess", log, "--out", out, *FLAGS, "--strict")
    assert_one_line_error(cli(*command, ok=False), r"^error: .*train\.txt:1501: row: 1 fields, ")
    _replace_keeping_size_and_time(log, text)
    cli(*command)
    assert _dataset(out) == want


def test_a_finished_dataset_refused_by_a_lower_fraction_is_not_wiped_by_another_input(
    good: tuple[bytes, dict[str, bytes]], tmp_path: Path
) -> None:
    # Before, the refusal of the rerun (the dataset itself untouched) marked the folder refused,
    # so a command with another input in the same --out removed the finished dataset's parts
    # with no refusal, leaving its manifest naming them ("d/train/part-00000-0000.arrow:
    # missing") wherever that command failed too.
    text, _ = good
    log, out = _input(tmp_path, _broken(text, range(100, 200)))
    cli("preprocess", log, "--out", out, *FLAGS, "--max-skipped-fraction", "0.5")
    finished = _dataset(out)
    assert_one_line_error(
        cli("preprocess", log, "--out", out, *FLAGS, ok=False),
        r"^error: .*100 of 3,000 lines malformed \(3\.33%",
    )
    other = tmp_path / "in" / "other.txt"
    other.write_bytes(text)
    assert_one_line_error(
        cli("preprocess", other, "--out", out, *FLAGS, ok=False),
        rf"^error: {re.escape(str(out))}: holds a run with different inputs \(train\.txt, now "
        r"other\.txt\); remove the directory or choose another --out$",
    )
    assert _dataset(out) == finished


def test_a_part_run_does_not_start_a_refused_run_over(
    good: tuple[bytes, dict[str, bytes]], tmp_path: Path
) -> None:
    # Before, each machine's --part run on the fixed input started the refused run over, so two
    # started together removed each other's files: one ended "error: out/.work/task-00027.json:
    # No such file or directory". Now a --part run is refused in one line, the refused run kept.
    text, _ = good
    log, out = _input(tmp_path, _broken(text, range(100, 200)))
    cli("preprocess", log, "--out", out, *FLAGS, ok=False)
    refused = _dataset(out)
    log.write_bytes(text)
    assert_one_line_error(
        cli("preprocess", log, "--out", out, *FLAGS, "--part", "0/2", ok=False),
        rf"^error: {re.escape(str(out))}: holds a run with different inputs \(train\.txt: "
        r"[\d,]+ bytes, now [\d,]+\), refused for its input; remove the directory, then start "
        r"the --part runs \(",
    )
    assert _dataset(out) == refused


PRICE_SPEC = """[format]
kind = "csv"
header = true

[[columns]]
name = "click"
role = "label"

[[columns]]
name = "price"
role = "dense"
type = "float"
transform = "{transform}"
"""


def test_the_spec_a_value_past_float32_asks_for_starts_over(tmp_path: Path) -> None:
    # Before, the refusal's own fix (the transform in the spec) was refused in turn: "error: out:
    # holds a run with different spec, spec_sha256; remove the directory or choose another
    # --out". A value its part cannot store is the input's refusal, as a malformed row is.
    log, spec, out = tmp_path / "log.csv", tmp_path / "spec.toml", tmp_path / "out"
    log.write_text("click,price\n" + "".join(f"{i % 2},{i}.5\n" for i in range(60)) + "1,1e40\n")
    spec.write_text(PRICE_SPEC.format(transform="none"))
    assert_one_line_error(
        cli("preprocess", log, "--spec", spec, "--out", out, ok=False),
        r"^error: .*log\.csv:62: price: 1e\+40 is past what float32 holds with transform none: "
        r'it would train as infinity; give price transform = "signed-log1p" in the spec$',
    )
    spec.write_text(PRICE_SPEC.format(transform="signed-log1p"))
    cli("preprocess", log, "--spec", spec, "--out", out)
    assert sum(Manifest.load(out).splits[s].rows for s in ("train", "val", "test")) == 61


def test_an_input_replaced_while_the_run_reads_it_makes_no_dataset_and_the_rerun_starts_over(
    good: tuple[bytes, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, exit 0 and a manifest: the first two tasks' parts held the flipped labels of the
    file a sync (`cp -p`, `rsync -t`) replaced while the run read it, the others the new file's,
    without a word; the rerun was refused ("holds a run with different inputs")."""
    text, want = good
    log, out = _input(tmp_path, _labels_flipped(text))
    run_tasks = pipeline._run_tasks

    def replaced_midway(cfg, todo, *args) -> None:
        run_tasks(cfg, todo[:2], *args)
        _replace_keeping_size_and_time(log, text)
        run_tasks(cfg, todo[2:], *args)

    with monkeypatch.context() as m:
        m.setattr(pipeline, "_run_tasks", replaced_midway)
        assert_one_line_error(
            cli("preprocess", log, "--out", out, *FLAGS, ok=False),
            rf"^error: {re.escape(str(out))}: an input changed while this run read it \(train\.txt:"
            r" other content of the same size and modification time\): its parts would mix the "
            r"file's bytes before and after, so no dataset is written; run the same command again:"
            r" it starts over on the file as it is now$",
        )
    assert not (out / "manifest.json").exists()
    cli("preprocess", log, "--out", out, *FLAGS)
    assert _dataset(out) == want
