"""What `shardrec synth` does to the folder it writes into (README, Failures and trust: Synthetic
data): it never replaces a file it did not write, nor leaves its output of other settings beside
the new one; a rerun of the same command into its own folder works."""

from __future__ import annotations

import re
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
