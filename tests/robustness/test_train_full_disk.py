"""A run directory on a full filesystem: the checkpoint's writes fail on every rank, and the job
ends in one line naming the directory and the bytes the checkpoint needs (the ranks refuse alike,
and the launcher says it once), with no temporary directory left on the full disk (README, Failures
and trust: Training). A save that fails with an exception that says nothing is named by its type
and what failed, never an empty cause.

The filesystem is a 128 KiB tmpfs mounted in a mount namespace of the job's own (`unshare -Urm`:
no root needed where unprivileged user namespaces are on), so the test needs no disk image."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import TINY_MODEL, assert_one_line_error, settings, train_command

_SAVE_FAILS_WITHOUT_A_MESSAGE = """
import os

if "LOCAL_RANK" in os.environ:  # the ranks, not the launcher nor torchrun's agent
    import torch.distributed.checkpoint as dcp

    def save(*args, **kwargs):
        raise MemoryError()  # as an allocation that fails while the shards are written

    dcp.save = save
"""


def _bytes(shown: str) -> float:
    """'1.2 MB' or '3,400 bytes' as a number of bytes."""
    number, unit = shown.split()
    return float(number.replace(",", "")) * (1e6 if unit == "MB" else 1)


def _user_namespaces() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        probe = ["unshare", "-Urm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt || exit 1"]
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _user_namespaces(), reason="needs `unshare -Urm` to mount a small tmpfs")
def test_a_full_disk_ends_the_job_in_one_line_naming_the_bytes_and_leaves_no_temporary(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    small = tmp_path / "small"
    small.mkdir()
    # 64-wide tables (~350 KB of weights and state): the run's own files fit in 128 KiB, its
    # first checkpoint does not.
    job = settings(
        'train.device="cpu"',
        *TINY_MODEL,
        "model.embedding_dim=64",
        "model.dense_arch=[16, 64]",
        "train.global_batch_size=64",
        'data.eval_splits=["val"]',
        "checkpoint.interval_steps=2",
    )
    command = shlex.join(train_command(tiny_dataset, small / "run", *job, "--steps", "4"))
    script = (
        f"mount -t tmpfs -o size=128k tmpfs {shlex.quote(str(small))} || exit 99\n"
        f"{command}\nrc=$?\n"
        f"echo LEFT: $(ls -A {shlex.quote(str(small / 'run' / 'checkpoints'))})\nexit $rc\n"
    )
    done = subprocess.run(
        ["unshare", "-Urm", "sh", "-c", script], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    line = (
        f"{small / 'run' / 'checkpoints' / '.step-00000002.tmp'}: the checkpoint of step 2: No "
        "space left on device: it needs "
    )
    # The ranks agree and refuse; the launcher's line, alone (no rank's, no torchrun's), says it.
    assert len(lines) == 1, lines
    assert lines[-1].startswith("error: training failed: rank "), lines
    assert line in lines[-1], lines[-1]
    needed, free = re.search(
        r"it needs ([\d.,]+ \w+), ([\d.,]+ \w+) free there", lines[-1]
    ).groups()
    assert _bytes(needed) > 300_000 and _bytes(free) < 131_072, lines[-1]
    assert done.stdout.splitlines()[-1] == "LEFT:", done.stdout  # no .step-*.tmp on the full disk


@pytest.mark.slow
def test_a_save_that_fails_without_a_message_names_its_type_and_what_failed(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    # Before: '... the checkpoint of step 2 failed on rank 0: MemoryError: ', an empty cause.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SAVE_FAILS_WITHOUT_A_MESSAGE)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    run = tmp_path / "run"
    job = settings(
        'train.device="cpu"',
        *TINY_MODEL,
        "train.global_batch_size=64",
        'data.eval_splits=["val"]',
        "train.log_interval=1000",
        "checkpoint.interval_steps=2",
    )
    done = subprocess.run(
        train_command(tiny_dataset, run, *job, "--steps", "4", nproc=1),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert_one_line_error(
        done,
        "^"
        + re.escape(
            f"error: training failed: rank 0: {run / 'checkpoints' / '.step-00000002.tmp'}: the "
            "checkpoint of step 2 failed on rank 0: MemoryError (no message) while writing its "
            "files"
        )
        + "$",
    )
