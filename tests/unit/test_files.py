from pathlib import Path

import pytest

from shardrec.dataloader.files import atomic_open, atomic_path, atomic_write_bytes


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
        assert not target.exists() and tmp.parent == tmp_path and tmp.name.startswith(".day_0_dense.npy.tmp-")
    assert target.read_bytes() == b"x" and not tmp.exists()
