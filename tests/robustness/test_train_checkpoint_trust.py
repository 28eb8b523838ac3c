"""Loading a checkpoint must not run code someone planted in it (README, Failures and trust:
Training, what you must trust).

One process, no torchrec: a CheckpointManager saves, the files are tampered with, and the load
is refused naming the file before anything of it is unpickled (the marker file a planted
pickle would create never appears). `shardrec train`'s one-line refusal of a tampered
checkpoint is checked on a real run directory in test_train_launcher.py.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import pytest
import torch

from shardrec.trainer.distributed.dist import DistEnv
from shardrec.trainer.rundir.checkpoint.manager import CheckpointManager
from shardrec.trainer.rundir.checkpoint.parts import (
    CheckpointParts,
    ModuleState,
    RngState,
    TrainProgress,
)
from shardrec.trainer.rundir.checkpoint.trust import UntrustedCheckpoint, verify_checkpoint
from shardrec.trainer.rundir.names import DIGESTS

ENV = DistEnv(
    rank=0,
    local_rank=0,
    world_size=1,
    local_world_size=1,
    device=torch.device("cpu"),
    backend="gloo",
)
SIGNATURE = {
    "model": {"arch": "dlrm"},
    "optim": {"sparse": "sgd"},
    "tables": [{"name": "t", "rows": 3, "dim": 2}],
}


class PlantedCode:
    """A pickle that, when loaded, creates `marker` (what an attacker's payload would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _manager(directory: Path) -> CheckpointManager:
    parts = CheckpointParts(
        progress=TrainProgress(step=3),
        sharded={"model": ModuleState(torch.nn.Linear(2, 2))},
        main={},
        signature=SIGNATURE,
        layout='{"tables": []}',
    )
    return CheckpointManager(directory, ENV, keep=2, parts=parts)


def _saved(tmp_path: Path) -> Path:
    path = _manager(tmp_path / "ckpt").save()
    assert (path / DIGESTS).is_file()
    return path


def _assert_refused(directory: Path, pattern: str, marker: Path) -> None:
    with pytest.raises(UntrustedCheckpoint) as caught:
        _manager(directory).load_latest()
    line = str(caught.value)
    assert "\n" not in line and re.search(pattern, line), line
    assert not marker.exists(), "the planted pickle ran"


@pytest.mark.parametrize("target", [".metadata", "train_state.pt", "rng-0.pt"])
def test_a_planted_pickle_is_refused_naming_the_file_and_never_runs(
    tmp_path: Path, target: str
) -> None:
    path = _saved(tmp_path)
    marker = tmp_path / "pwned"
    (path / target).write_bytes(pickle.dumps(PlantedCode(marker)))
    _assert_refused(
        tmp_path / "ckpt", re.escape(str(path / target)) + ".*differ from the digest", marker
    )
    with pytest.raises(
        UntrustedCheckpoint, match=re.escape(target)
    ):  # the CLI's check says the same
        verify_checkpoint(path, skip_suffix=".distcp")
    assert not marker.exists()


def test_a_rewritten_digest_file_someone_else_could_write_is_refused(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    marker = tmp_path / "pwned"
    (path / ".metadata").write_bytes(pickle.dumps(PlantedCode(marker)))
    # The attacker updates the digests too; they could only because the file is writable to others.
    from shardrec.trainer.rundir.checkpoint.trust import write_digests

    write_digests(path)
    os.chmod(path / DIGESTS, 0o666)
    _assert_refused(
        tmp_path / "ckpt", re.escape(str(path / DIGESTS)) + r": writable by other users", marker
    )
    os.chmod(path / DIGESTS, 0o644)
    os.chmod(path, 0o777)
    _assert_refused(tmp_path / "ckpt", re.escape(str(path)) + r": writable by other users", marker)


def test_an_added_file_and_a_missing_file_are_named(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    marker = tmp_path / "pwned"
    (path / "extra.pt").write_bytes(b"x")
    _assert_refused(tmp_path / "ckpt", re.escape(str(path / "extra.pt")) + ": not listed", marker)
    (path / "extra.pt").unlink()
    (path / "rng-0.pt").unlink()
    _assert_refused(
        tmp_path / "ckpt", re.escape(str(path / "rng-0.pt")) + ": listed .* but missing", marker
    )


def test_a_checkpoint_without_digests_is_not_complete(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    (path / DIGESTS).unlink()
    assert _manager(tmp_path / "ckpt").load_latest() is None  # as if the save had not finished


def test_a_checkpoint_folder_holding_another_steps_files_is_refused(tmp_path: Path) -> None:
    """A folder named step 5 that holds step 3's files (a copy, an overwrite cut short) matches
    its digests; loaded, it would resume at step 3, or be evaluated as step 5, without a word."""
    import shutil

    path = _saved(tmp_path)
    copy = path.with_name("step-00000005")
    shutil.copytree(path, copy)
    _assert_refused(
        tmp_path / "ckpt",
        re.escape(str(copy / "train_state.pt"))
        + r": holds the checkpoint of step 3, not of step 5 as its folder's name says .*; "
        + "refusing the checkpoint$",
        tmp_path / "pwned",
    )
    shutil.rmtree(copy)
    assert _manager(tmp_path / "ckpt").load_latest() == 3  # a folder of its own step loads


def test_every_file_loads_with_weights_only_and_rng_states_round_trip(tmp_path: Path) -> None:
    import random

    import numpy as np

    path = _saved(tmp_path)
    for name in ("train_state.pt", "rng-0.pt"):
        torch.load(
            path / name, weights_only=True
        )  # raises on anything but tensors and plain values
    rng = RngState()
    saved = torch.load(path / "rng-0.pt", weights_only=True)
    rng.load_state_dict(saved)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    rng.load_state_dict(saved)
    assert torch.equal(torch.rand(3), expected[0]) and np.array_equal(
        np.random.rand(3), expected[1]
    )
    assert random.random() == expected[2]


def test_every_rank_checks_its_own_share_of_the_files(tmp_path: Path):
    """The ranks share the hashing: rank r checks every world_size-th file from the r-th. A file
    changed in rank 1's share of a 2-rank check is found by rank 1, and only there."""
    from shardrec.trainer.rundir.checkpoint.trust import read_digests, verify_files, write_digests

    directory = tmp_path / "step"
    directory.mkdir()
    for i in range(6):
        (directory / f"file-{i}").write_bytes(bytes([i]) * 10)
    write_digests(directory)
    digests = read_digests(directory)
    shares = [sorted(digests)[r::2] for r in range(2)]
    assert verify_files(directory, digests, 0, 2) == verify_files(directory, digests, 1, 2) == ""
    (directory / shares[1][0]).write_bytes(b"changed")
    assert verify_files(directory, digests, 0, 2) == ""
    problem = verify_files(directory, digests, 1, 2)
    assert problem.startswith(f"{directory / shares[1][0]}: contents differ from the digest"), (
        problem
    )
    assert verify_files(directory, digests, 0, 1) == problem  # one rank checks them all
