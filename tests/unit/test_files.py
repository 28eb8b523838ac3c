import os
from pathlib import Path

import pytest
from helpers import record_syncs_and_renames

from shardrec.dataloader.util.files import atomic_open, atomic_path, atomic_write_bytes


def test_atomic_write_creates_folders_and_leaves_only_the_file(tmp_path: Path):
    target = tmp_path / "a" / "b" / "out.json"
    atomic_write_bytes(target, b"one")
    atomic_write_bytes(target, b"two")
    assert target.read_bytes() == b"two"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.json"]


def test_a_failed_write_keeps_the_old_file_and_no_temporary(tmp_path: Path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk on fire"):
        with atomic_open(target) as f:
            f.write(b"half of the new")
            raise RuntimeError("disk on fire")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_atomic_path_hides_the_file_until_the_writer_is_done(tmp_path: Path):
    target = tmp_path / "day_0_dense.npy"
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"x")
        assert (
            not target.exists()
            and tmp.parent == tmp_path
            and tmp.name.startswith(".day_0_dense.npy.tmp-")
        )
    assert target.read_bytes() == b"x" and not tmp.exists()


def test_the_file_is_synced_before_its_rename_and_the_directory_after(tmp_path: Path, monkeypatch):
    """A crash at any moment leaves the old file or the whole new one: the temporary's data is on
    disk before the rename makes it the file, and the rename is on disk before the write returns."""
    target = tmp_path / "dir" / "out.bin"
    atomic_write_bytes(target, b"first")
    events = record_syncs_and_renames(monkeypatch)
    atomic_write_bytes(target, b"second")
    assert events == [f"fsync .out.bin.tmp-{os.getpid()}", "replace out.bin", "fsync dir"]
    events.clear()
    with atomic_path(target, fsync=False) as tmp:
        tmp.write_bytes(b"third")
    assert events == ["replace out.bin"]  # the caller syncs it itself (preprocess's parts)
    events.clear()
    with atomic_open(target, sync_dir=False) as f:
        f.write(b"fourth")
    # The file before its rename; the directory once, by the caller, after its last file (vocabulary
    # runs).
    assert events == [f"fsync .out.bin.tmp-{os.getpid()}", "replace out.bin"]


def test_a_write_without_space_is_one_line_naming_the_path_and_the_bytes(
    tmp_path: Path, monkeypatch
):
    import errno

    from shardrec.dataloader.util import files

    def full(path):  # what a full disk gives when the file's pages are flushed
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files, "fsync_path", full)
    target = tmp_path / "plan.json"
    with pytest.raises(files.WriteError) as e:
        atomic_write_bytes(target, b"x" * 2500)
    assert str(e.value).startswith(
        f"{target}: No space left on device: it needs 2,500 bytes, "
    ) and str(e.value).endswith(" free there; free space or write elsewhere")
    assert isinstance(e.value, ValueError)  # the commands print it as their one line
    assert list(tmp_path.iterdir()) == []  # no temporary left behind
    # An error of another file, read inside the block, is that file's, not the target's.
    with pytest.raises(FileNotFoundError):
        with atomic_open(tmp_path / "out.bin") as f:
            f.write(open(tmp_path / "missing").read().encode())  # noqa: SIM115


def test_a_writer_that_fails_before_writing_gets_its_own_error(tmp_path: Path):
    """A writer that raises before it created the temporary (a bad array refused by np.save, a
    figure that fails to render) sees its own error, not a FileNotFoundError from the clean-up."""
    target = tmp_path / "out.npy"
    with pytest.raises(ValueError, match="bad row 3"):
        with atomic_path(target):
            raise ValueError("bad row 3")
    assert list(tmp_path.iterdir()) == []


def test_atomic_path_makes_the_rename_durable_by_default(tmp_path: Path, monkeypatch):
    """Writers that take a file name (np.save, savefig) get the same durability as atomic_open:
    the directory is synced after the rename unless the caller says it syncs it itself."""
    target = tmp_path / "arrays" / "out.npy"
    events = record_syncs_and_renames(monkeypatch)
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"x")
    assert events == [f"fsync .out.npy.tmp-{os.getpid()}", "replace out.npy", "fsync arrays"]
