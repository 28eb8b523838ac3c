"""The digests of a saved checkpoint and the one line that refuses a checkpoint someone could have
changed (trainer/rundir/checkpoint/trust.py), on a directory of plain files: no torch, no ranks.
A CheckpointManager's save and load around them: tests/robustness/test_train_checkpoint_trust.py.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from shardrec.trainer.rundir import names
from shardrec.trainer.rundir.checkpoint.folders import misnamed_checkpoints
from shardrec.trainer.rundir.checkpoint.trust import (
    UntrustedCheckpoint,
    complete_checkpoints,
    read_digests,
    verify_checkpoint,
    write_digests,
)


def _checkpoint(tmp_path: Path) -> Path:
    directory = tmp_path / "step-00000003"
    (directory / "sub").mkdir(parents=True)
    (directory / "a.bin").write_bytes(b"\x00\x01")
    (directory / "sub" / "b.json").write_bytes(b"{}\n")
    return directory


def _refusal(directory: Path) -> str:
    with pytest.raises(UntrustedCheckpoint) as caught:
        verify_checkpoint(directory)
    return str(caught.value)


def test_the_digests_file_is_a_sorted_sha256_table_of_version_1(tmp_path: Path) -> None:
    """digests.json is read by every later version (and by people checking a checkpoint with
    sha256sum): its bytes stay as they were written before."""
    directory = _checkpoint(tmp_path)
    write_digests(directory)
    a, b = hashlib.sha256(b"\x00\x01").hexdigest(), hashlib.sha256(b"{}\n").hexdigest()
    assert (directory / "digests.json").read_text() == (
        '{\n "algorithm": "sha256",\n "files": {\n'
        f'  "a.bin": "{a}",\n  "sub/b.json": "{b}"\n'
        ' },\n "version": 1\n}\n'
    )
    assert read_digests(directory) == {"a.bin": a, "sub/b.json": b}


def test_the_save_leaves_the_checkpoint_writable_by_its_owner_only_whatever_the_umask(
    tmp_path: Path,
) -> None:
    directory = _checkpoint(tmp_path)
    os.chmod(directory, 0o775)
    old = os.umask(0o002)
    try:
        write_digests(directory)
    finally:
        os.umask(old)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o755
    assert stat.S_IMODE((directory / "digests.json").stat().st_mode) == 0o644
    verify_checkpoint(directory)  # and the load takes it


def test_a_checkpoint_of_another_user_is_refused_in_one_line(tmp_path: Path, monkeypatch) -> None:
    directory = _checkpoint(tmp_path)
    write_digests(directory)
    owner = directory.stat().st_uid
    monkeypatch.setattr(os, "getuid", lambda: owner + 1)
    assert _refusal(directory) == (
        f"{directory}: owned by uid {owner}, not by this user (uid {owner + 1}); "
        "refusing a checkpoint someone else wrote"
    )


def test_digests_others_could_rewrite_are_refused_saying_how_to_trust_them(
    tmp_path: Path,
) -> None:
    directory = _checkpoint(tmp_path)
    write_digests(directory)
    digests = directory / "digests.json"
    os.chmod(digests, 0o666)
    assert _refusal(directory) == (
        f"{digests}: writable by other users (mode 666); "
        f"refusing it (chmod go-w {digests} if you trust it)"
    )


@pytest.mark.parametrize("text", ["[]", '{"files": 3}', '{"files": {"a.bin": 1}}'])
def test_a_file_that_is_not_a_digests_table_is_refused(tmp_path: Path, text: str) -> None:
    directory = _checkpoint(tmp_path)
    write_digests(directory)
    (directory / "digests.json").write_text(text)
    assert _refusal(directory) == (
        f"{directory / 'digests.json'}: not a digests file (no files -> sha256 table)"
    )


def test_unreadable_digests_are_refused_naming_the_file(tmp_path: Path) -> None:
    directory = _checkpoint(tmp_path)
    write_digests(directory)
    (directory / "digests.json").write_text("{not json")
    assert _refusal(directory).startswith(f"{directory / 'digests.json'}: unreadable digests (")


def test_an_added_a_missing_and_a_changed_file_are_each_refused_in_one_line(
    tmp_path: Path,
) -> None:
    directory = _checkpoint(tmp_path)
    write_digests(directory)
    (directory / "planted.pt").write_bytes(b"x")
    assert _refusal(directory) == (
        f"{directory / 'planted.pt'}: not listed in digests.json (added after the save); "
        "refusing the checkpoint"
    )
    (directory / "planted.pt").unlink()
    (directory / "a.bin").write_bytes(b"\x00\x02")
    assert _refusal(directory) == (
        f"{directory / 'a.bin'}: contents differ from the digest written at save time "
        "(changed since); refusing the checkpoint"
    )
    (directory / "a.bin").unlink()
    assert _refusal(directory) == (
        f"{directory / 'a.bin'}: listed in digests.json but missing; refusing the checkpoint"
    )


def test_a_checkpoint_past_step_99_999_999_is_read_by_its_name_not_called_renamed(
    tmp_path: Path,
) -> None:
    """checkpoint_name gives step 123,456,789 nine digits. Before, the pattern wanted eight, so
    that checkpoint was passed over on resume and `train` refused it as renamed by hand; a
    nine-digit name with a leading zero is no name checkpoint_name gives."""
    for step in (8, 123_456_789):
        (tmp_path / names.checkpoint_name(step)).mkdir()
        (tmp_path / names.checkpoint_name(step) / names.DIGESTS).write_text("{}")
    (tmp_path / "step-012345678").mkdir()
    (tmp_path / "step-012345678" / names.DIGESTS).write_text("{}")
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [8, 123_456_789]
    assert misnamed_checkpoints(tmp_path) == [tmp_path / "step-012345678"]
