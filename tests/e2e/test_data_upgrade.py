"""`shardrec data upgrade DIR`: a dataset of the old layout (a folder of .npy files per part) is
refused by every reader in one line naming the command, which rewrites it in place as the files a
fresh write gives, checksums checked, keeping its fingerprints and stream; interrupted at any
point, the same command finishes it."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_tiny_dataset
from dataset_writing import write_old_layout
from helpers import assert_one_line_error, cli

from shardrec.dataloader.format.fingerprints import dataset_fingerprint, split_fingerprint
from shardrec.dataloader.format.manifest import Manifest
from shardrec.tools.preprocess.derived import dataset_upgrade
from shardrec.tools.preprocess.derived.old_layout import (
    load_old,
    old_fingerprint,
    old_split_fingerprint,
)

ROWS = {"train": [300, 200, 250], "val": [120], "test": [130]}


@pytest.fixture
def old(tmp_path: Path) -> tuple[Path, Path]:
    """(the dataset written in the current layout, the same rows in the old layout)."""
    write_tiny_dataset(tmp_path / "new", rows=ROWS, multi_hot=("f1",))
    write_old_layout(tmp_path / "new", tmp_path / "old")
    return tmp_path / "new", tmp_path / "old"


def _files(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


def _digests(directory: Path) -> list[str]:
    out = cli("data", "digest", directory, "--global-batch", "64", "--batches", "8", "--json")
    return [row["sha256"] for row in json.loads(out.stdout)["digests"]]


def test_an_old_dataset_is_refused_by_readers_and_upgraded_to_a_fresh_writes_bytes(old):
    new, directory = old
    for args in (["stats"], ["head"], ["verify"], ["digest", "--global-batch", "64"]):
        assert_one_line_error(
            cli("data", *args, directory, ok=False),
            rf"schema_version 2, .* with `shardrec data upgrade {directory}`",
        )
    manifest, version = load_old(directory)
    fingerprint = old_fingerprint(manifest)
    splits = {s: old_split_fingerprint(manifest, s) for s in manifest.splits}
    result = json.loads(cli("data", "upgrade", directory, "--json").stdout)
    assert (result["from_version"], result["parts"], result["parts_written"]) == (2, 5, 5)
    assert result["rows"] == sum(sum(r) for r in ROWS.values())
    assert _files(directory) == _files(new)  # the part files a fresh write gives, nothing else
    upgraded = Manifest.load(directory)
    assert upgraded.schema_version == 3 and upgraded.upgraded_from["schema_version"] == 2
    # The same rows: runs of the old layout resume (the fingerprints they recorded hold).
    assert dataset_fingerprint(upgraded) == fingerprint
    assert {s: split_fingerprint(upgraded, s) for s in upgraded.splits} == splits
    assert _digests(directory) == _digests(new)
    assert cli("data", "verify", directory).exit_code == 0
    again = json.loads(cli("data", "upgrade", directory, "--json").stdout)
    assert again["from_version"] is None and _files(directory) == _files(new)
    # Nothing to do: the dataset's parts and rows as they are, none written (not 0 parts, 0 rows).
    assert (again["parts"], again["parts_written"], again["rows"]) == (5, 0, result["rows"])
    assert again["bytes"] == result["bytes"]


def test_a_changed_old_file_is_named_and_nothing_is_lost(old):
    new, directory = old
    victim = directory / "train" / "part-00001" / "f3.npy"
    good = victim.read_bytes()
    bad = bytearray(good)
    bad[-1] ^= 0xFF  # same size: only the checksum can tell
    victim.write_bytes(bytes(bad))
    before = (directory / "manifest.json").read_bytes()
    assert_one_line_error(
        cli("data", "upgrade", directory, ok=False),
        rf"{victim}: checksum differs from the manifest",
    )
    assert (directory / "manifest.json").read_bytes() == before  # still the old dataset, whole
    assert (directory / "train" / "part-00000.arrow").is_file()  # part 0 was written
    victim.write_bytes(good)
    result = json.loads(cli("data", "upgrade", directory, "--json").stdout)
    assert (result["parts"], result["parts_written"]) == (5, 4)  # part 0 kept
    assert _files(directory) == _files(new)


def test_an_interrupted_upgrade_is_finished_by_the_same_command(old, monkeypatch):
    new, directory = old
    real = dataset_upgrade.write_part
    written = []

    def interrupted(*args, **kwargs):
        if len(written) == 3:
            raise KeyboardInterrupt  # Ctrl-C while the 4th part is written
        written.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(dataset_upgrade, "write_part", interrupted)
    with pytest.raises(KeyboardInterrupt):
        dataset_upgrade.upgrade_dataset(directory)
    assert load_old(directory) is not None  # the old manifest: readers still refuse it whole
    monkeypatch.setattr(dataset_upgrade, "write_part", real)
    # killed after the commit, while the old folders were being removed
    real_remove = dataset_upgrade._remove_old
    monkeypatch.setattr(dataset_upgrade, "_remove_old", lambda d: (_ for _ in ()).throw(OSError))
    with pytest.raises(OSError):
        dataset_upgrade.upgrade_dataset(directory)
    assert Manifest.load(directory).schema_version == 3
    assert (directory / "train" / "part-00000").is_dir()  # old folders still there
    monkeypatch.setattr(dataset_upgrade, "_remove_old", real_remove)
    finished = dataset_upgrade.upgrade_dataset(directory)
    assert finished.from_version is None  # already upgraded: only the leftovers removed
    assert _files(directory) == _files(new)
    assert not (directory / ".work").exists()


# Sends the signal to its own process as the 3rd part is written, then runs the command.
_STOPPED_UPGRADE = """
import os, signal, sys
from shardrec.tools.preprocess.derived import dataset_upgrade
from shardrec.tools.cli.entry import main
real, written, stop = dataset_upgrade.write_part, [], getattr(signal, sys.argv[1])
def write_part(*args, **kwargs):
    if len(written) == 2:
        os.kill(os.getpid(), stop)
    written.append(args[0])
    return real(*args, **kwargs)
dataset_upgrade.write_part = write_part
sys.argv = ["shardrec", "data", "upgrade", sys.argv[2]]
main()
"""


@pytest.mark.parametrize("stop, code", [("SIGINT", 130), ("SIGTERM", 143)])
def test_ctrl_c_or_a_kill_says_so_in_one_line_and_the_rerun_finishes(old, stop, code):
    """Ctrl-C, or a kill (SIGTERM: how a script stops its `&` job), mid-upgrade: exit 130 or 143
    and the one `interrupted:` line (a kill ended it silently before); the rerun finishes."""
    new, directory = old
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", _STOPPED_UPGRADE, stop, str(directory)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == code, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        f"interrupted: {directory}: nothing is lost (the old files stay until the new manifest is "
        "written, and the parts rewritten so far are kept); rerun the same command to finish"
    ]
    assert load_old(directory) is not None  # still the old dataset, whole
    result = json.loads(cli("data", "upgrade", directory, "--json").stdout)
    assert (result["parts"], result["parts_written"]) == (5, 3)  # the two written were kept
    assert _files(directory) == _files(new)


def test_a_read_only_dataset_is_refused_in_one_line_saying_to_upgrade_a_copy(old, monkeypatch):
    """A read-only mount: every write there fails with EROFS, for root too (a chmod does not stop
    root, so the test makes the failure where the upgrade's first write, its lock, meets it).
    Before: `error: [Errno 30] Read-only file system: 'DIR/.work'`."""
    new, directory = old
    real_access = os.access

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(directory / ".work"))

    def no_writing(path, mode):  # os.access on a read-only mount
        return real_access(path, mode) and not (mode & os.W_OK and Path(path) in (directory, new))

    monkeypatch.setattr(dataset_upgrade.locks, "dataset_lock", read_only)
    monkeypatch.setattr(os, "access", no_writing)
    assert_one_line_error(
        cli("data", "upgrade", directory, ok=False),
        rf"^error: {directory}: cannot upgrade in place: the folder is read-only "
        rf"\({directory / '.work'}\); copy the dataset somewhere writable and rewrite the copy "
        r"with `shardrec data upgrade COPY`$",
    )
    assert_one_line_error(  # the readers' refusal says the same
        cli("data", "stats", directory, ok=False),
        r"schema_version 2, .*; its folder is read-only, so copy the dataset somewhere writable "
        r"and rewrite the copy \(one file per part, checksums checked\) with "
        r"`shardrec data upgrade COPY`$",
    )
    assert load_old(directory) is not None
    # one already of the current layout has nothing to write: said so, as on a writable folder
    done = cli("data", "upgrade", new)
    assert done.stdout == f"{new}: already one file per part (schema version 3); nothing to do\n"
