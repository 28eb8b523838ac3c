"""One writer per dataset: a second `shardrec preprocess` into an --out another one is writing is
refused in one line naming the holder, and a dataset without its manifest says whether it is
being written (and by whom) or was left unfinished, instead of "not a shardrec dataset".

The first writer is a process holding the dataset's lock as `shardrec preprocess` does
(dataloader.locks.dataset_lock), so the test needs no race with a real preprocessing run."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import assert_one_line_error
from typer.testing import CliRunner

from shardrec.dataloader.format.manifest import DatasetError, Manifest
from shardrec.tools.cli.app import app

_WRITER = """
import sys, time
from pathlib import Path
from shardrec.dataloader.util.locks import dataset_lock
dataset_lock(Path(sys.argv[1]))
print("locked", flush=True)
time.sleep(120)
"""


def test_a_busy_out_is_refused_and_a_dataset_being_written_says_so(tmp_path: Path) -> None:
    out = tmp_path / "data"
    raw = tmp_path / "raw.tsv"
    raw.write_text("1\t" + "\t".join(["5"] * 13 + ["a1"] * 26) + "\n")
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout.readline().strip() == "locked"
        second = CliRunner().invoke(app, ["preprocess", str(raw), "--out", str(out)])
        assert_one_line_error(
            second,
            rf"^error: {re.escape(str(out))} is being written by shardrec preprocess on host "
            rf"{re.escape(socket.gethostname())}, pid {writer.pid} "
            rf"\(lock file {re.escape(str(out / '.work' / 'lock'))}\); wait for it to end or choose another --out$",
        )
        with pytest.raises(DatasetError) as reading:
            Manifest.load(out)
        assert str(reading.value) == (
            f"{out}: being written by shardrec preprocess on host {socket.gethostname()}, pid {writer.pid} "
            "(no manifest.json yet); wait for it to finish"
        )
    finally:
        writer.kill()
        writer.wait()
    # The writer died before its manifest: the kernel freed its lock; the dataset is unfinished.
    deadline = time.monotonic() + 10
    while True:
        try:
            Manifest.load(out)
        except DatasetError as e:
            if "did not finish" in str(e) or time.monotonic() > deadline:
                message = str(e)
                break
        time.sleep(0.1)
    assert message == (
        f"{out}: preprocessing did not finish (no manifest.json; .work/ holds its finished tasks); "
        "rerun the same `shardrec preprocess` command to complete it"
    )
    finished = CliRunner().invoke(app, ["preprocess", str(raw), "--out", str(out), "--json"])
    assert finished.exit_code == 0, finished.output
    assert sum(split.rows for split in Manifest.load(out).splits.values()) == 1
