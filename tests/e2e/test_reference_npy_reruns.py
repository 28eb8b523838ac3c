"""`shardrec data reference-npy` run again into the same --out, on day files given out of order,
on gzipped day files, and stopped by Ctrl-C: what the user sees (exit code, the one line) and the
bytes left under --out."""

from __future__ import annotations

import gzip
import os
import re
from pathlib import Path

import pytest
from helpers import assert_one_line_error, cli

from shardrec.tools.synth.criteo import write_dataset

MIN2 = ("--dense", "log-min2")  # synthetic I2 holds -3, which log3 refuses


def _days(directory: Path, rows: int, days: int = 3) -> list[Path]:
    return write_dataset(directory, rows=rows, seed=1, days=days, max_vocab=50)


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("day_*.npy"))}


def _reference(days: list[Path], out: Path, *flags: str, ok: bool = True):
    return cli("data", "reference-npy", *days, "--out", out, *flags, ok=ok)


def test_a_rerun_with_other_inputs_or_settings_is_refused_naming_what_differs(tmp_path: Path):
    days, out = _days(tmp_path / "raw", 300), tmp_path / "ref"
    done = _reference(days, out, "--dense", "log-min2")
    assert "wrote 3 day file(s), 300 rows" in done.stdout
    written = _files(out)
    assert len(written) == 9
    # The same command again: nothing to do, the same answer.
    assert "wrote 3 day file(s), 300 rows" in _reference(days, out, "--dense", "log-min2").stdout
    where = re.escape(str(out))
    hint = "; choose a new --out or remove the old one$"
    refused = _reference(days, out, "--dense", "log-min2", "--seed", "1", ok=False)
    assert_one_line_error(
        refused, rf"^error: {where}: holds arrays made with another seed \(0, now 1\){hint}"
    )
    refused = _reference(days, out, "--dense", "log3", ok=False)
    assert_one_line_error(
        refused,
        rf"^error: {where}: holds arrays made with another dense \(log-min2, now log3\){hint}",
    )
    # Day files of the same names with ten times the rows, in another folder.
    more = _days(tmp_path / "more", 3000)
    refused = _reference(more, out, "--dense", "log-min2", ok=False)
    assert_one_line_error(
        refused,
        rf"^error: {where}: holds arrays made with other inputs \(day_0: [\d,]+ bytes, now [\d,]+\){hint}",
    )
    assert _files(out) == written
    # Arrays whose making is not recorded (an older shardrec's): their settings are unknown.
    (out / "reference-npy.json").unlink()
    refused = _reference(days, out, "--dense", "log-min2", ok=False)
    assert_one_line_error(
        refused, rf"^error: {where}: holds day files \(day_0_dense\.npy\) but no record "
    )
    assert _files(out) == written


def test_day_files_out_of_order_are_refused_naming_the_first_and_the_order(tmp_path: Path):
    days, out = _days(tmp_path / "raw", 330, days=11), tmp_path / "ref"
    shell_order = sorted(days, key=lambda p: p.name)  # what `raw/day_*` expands to
    raw = re.escape(str(tmp_path / "raw"))
    refused = _reference(shell_order, out, *MIN2, ok=False)
    assert_one_line_error(
        refused,
        rf"^error: {raw}/day_10: given after day_1; give the day files in order, e.g. "
        rf"{raw}/day_\{{0\.\.10\}}$",
    )
    gap = _reference([days[0], days[1], days[3]], out, *MIN2, ok=False)
    assert_one_line_error(gap, rf"^error: {raw}/day_3: given after day_1 \(day_2 is missing\); ")
    assert not out.exists()
    _reference(days, out, *MIN2)  # in order
    assert len(_files(out)) == 33


def test_gzipped_day_files_give_the_arrays_of_the_plain_ones(tmp_path: Path):
    days = _days(tmp_path / "raw", 300)
    zipped = []
    for path in days:
        zipped.append(tmp_path / "gz" / f"{path.name}.gz")
        zipped[-1].parent.mkdir(exist_ok=True)
        zipped[-1].write_bytes(gzip.compress(path.read_bytes()))
    _reference(days, tmp_path / "plain", *MIN2)
    assert "wrote 3 day file(s), 300 rows" in _reference(zipped, tmp_path / "zipped", *MIN2).stdout
    assert _files(tmp_path / "zipped") == _files(tmp_path / "plain")
    # A .gz file cut short is one line naming it.
    zipped[1].write_bytes(zipped[1].read_bytes()[:-200])
    cut = _reference(zipped, tmp_path / "cut", *MIN2, ok=False)
    assert_one_line_error(cut, rf"^error: {re.escape(str(zipped[1]))}: unreadable or truncated")


def _stopped_once_parsed(days: list[Path], out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run stopped by Ctrl-C once every day is parsed (its .work holds them)."""
    from shardrec.tools.preprocess.derived import mlperf_reference

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(mlperf_reference, "write_days", stopped)
        result = _reference(days, out, *MIN2, ok=False)
    assert result.exit_code == 130, result.output
    assert result.stderr.strip().splitlines() == [
        f"interrupted: {out}: the files written so far are kept; rerun the same command to finish"
    ]


def test_ctrl_c_says_what_is_kept_and_the_same_command_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    days, out = _days(tmp_path / "raw", 300), tmp_path / "ref"
    _stopped_once_parsed(days, out, monkeypatch)
    _reference(days, out, *MIN2)
    _reference(days, tmp_path / "clean", *MIN2)
    assert _files(out) == _files(tmp_path / "clean")


def test_a_day_replaced_by_one_of_the_same_size_and_time_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A day file replaced after a stopped run by another of the same size and time (`cp -p`,
    `rsync -t`): before, the rerun went on from the parsed old day, exit 0, and day_0's labels
    in the arrays were the old file's."""
    days, out = _days(tmp_path / "raw", 300), tmp_path / "ref"
    _stopped_once_parsed(days, out, monkeypatch)
    st, text = days[0].stat(), days[0].read_bytes()
    flipped = b"\n".join(
        bytes([ord("1") + ord("0") - r[0]]) + r[1:] if r else r for r in text.split(b"\n")
    )
    days[0].write_bytes(flipped)
    os.utime(days[0], ns=(st.st_atime_ns, st.st_mtime_ns))
    refused = _reference(days, out, *MIN2, ok=False)
    assert_one_line_error(
        refused,
        rf"^error: {re.escape(str(out))}: holds arrays made with other inputs \(day_0: other "
        r"content of the same size and modification time\); choose a new --out or remove the "
        "old one$",
    )
    assert not _files(out)
