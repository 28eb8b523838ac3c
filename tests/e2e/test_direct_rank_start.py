"""A rank started directly (`python -m shardrec.trainer` with RANK, WORLD_SIZE and MASTER_* set,
as a script or torchrun sets them): how it says that it cannot join its group."""

from __future__ import annotations

import re
import socket
from pathlib import Path

from helpers import TINY_MODEL, assert_one_line_error, run_direct_rank, settings


def test_a_master_port_in_use_is_one_line_naming_it(tiny_dataset: Path, tmp_path: Path) -> None:
    # Before: typer's traceback of torch's DistNetworkError ("The server socket has failed to
    # listen on any local network address. port: ..., code: -98, name: EADDRINUSE").
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_direct_rank(
            "--data",
            str(tiny_dataset),
            "--out-dir",
            str(tmp_path / "run"),
            "--steps",
            "1",
            *settings(*TINY_MODEL, "train.global_batch_size=64", 'train.device="cpu"'),
            MASTER_PORT=str(port),
        )
    assert_one_line_error(
        done,
        "^"
        + re.escape(
            f"error: MASTER_PORT={port}: rank 0 cannot serve the process group's store on "
            f"127.0.0.1:{port}: another process listens there (another job's?); start the ranks "
            "with a free MASTER_PORT"
        )
        + "$",
    )


def test_a_refusal_is_said_by_the_first_rank_of_every_node(tmp_path: Path) -> None:
    # Before, only rank 0 said it: node 1 of a `torchrun --nnodes 2` whose copy of the dataset is
    # missing ended its ranks with exit code 1 and not a word on its terminal.
    missing = tmp_path / "data"
    done = run_direct_rank(
        "--data",
        str(missing),
        "--out-dir",
        str(tmp_path / "run"),
        *settings("train.global_batch_size=64", 'train.device="cpu"'),
        RANK="1",
        WORLD_SIZE="2",
    )
    assert_one_line_error(done, "^" + re.escape(f"error: {missing}: does not exist") + "$")


def test_a_node_whose_plan_file_is_missing_refuses_before_joining(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    # Before, the plan file was first read once the ranks had joined: rank 1 ended in typer's
    # traceback of "FileNotFoundError: ... 'plan.json'" (node_agreement.rank_view), rank 0 in one
    # of gloo's "Connection closed by peer" (here, alone, it waited for rank 0 in init).
    missing = tmp_path / "plan.json"
    done = run_direct_rank(
        "--data",
        str(tiny_dataset),
        "--plan",
        str(missing),
        "--out-dir",
        str(tmp_path / "run"),
        *settings("train.global_batch_size=64", 'train.device="cpu"', "dist.timeout_s=20"),
        RANK="1",
        WORLD_SIZE="2",
    )
    assert_one_line_error(
        done,
        "^"
        + re.escape(f"error: {missing}: cannot read plan file: No such file or directory")
        + "$",
    )


def _refused_at_once(data: Path, run: Path, message: str, **env: str | None) -> None:
    """A rank of a small CPU job with a 20 s timeout (a wait, should it wait) says `message` in
    one line."""
    done = run_direct_rank(
        "--data",
        str(data),
        "--out-dir",
        str(run),
        *settings("train.global_batch_size=64", 'train.device="cpu"', "dist.timeout_s=20"),
        **env,
    )
    assert_one_line_error(done, "^" + re.escape(message) + "$")


def test_a_rank_of_several_without_master_addr_is_one_line_not_a_wait(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    # Before, it waited dist.timeout_s (600 s) at 127.0.0.1:29500, then typer's traceback of
    # "DistNetworkError: The client socket has timed out after 600000ms while trying to connect to
    # (127.0.0.1, 29500)".
    _refused_at_once(
        tiny_dataset,
        tmp_path / "run",
        "error: WORLD_SIZE=2 but MASTER_ADDR and MASTER_PORT are not set: the ranks meet at "
        "rank 0's store, MASTER_ADDR:MASTER_PORT (rank 0's host and a free port there; "
        "torchrun sets both)",
        RANK="1",
        WORLD_SIZE="2",
        MASTER_ADDR=None,
        MASTER_PORT=None,
    )


def test_a_global_batch_that_does_not_divide_by_world_size_is_refused_before_joining(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    # Before, the ranks joined the group and rank 0's planner said "global batch size 64 is not
    # divisible by world size 3", naming no setting, while the others printed "error: rank N lost
    # another rank (... Connection closed by peer)" (here: a wait, rank 0 alone of 3).
    _refused_at_once(
        tiny_dataset,
        tmp_path / "run",
        "error: --set 'train.global_batch_size=64': train.global_batch_size = 64 does not "
        "divide by WORLD_SIZE=3, the job's ranks",
        WORLD_SIZE="3",
        LOCAL_WORLD_SIZE="3",
    )


def test_a_node_that_refuses_before_joining_ends_the_other_node_in_one_line(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    # Before, the node given good data waited in init_process_group for dist.timeout_s (600 s),
    # then typer's traceback of "DistStoreError: wait timeout after 600000ms" (or its agent lost
    # the refusing node's store and killed it 30 s later, in torch's tracebacks).
    import os
    import subprocess
    import time

    from shardrec.trainer.distributed.launch import torchrun_command
    from shardrec.trainer.distributed.local_ranks import free_port

    endpoint, missing = f"127.0.0.1:{free_port()}", tmp_path / "nodata"
    job = ["--out-dir", str(tmp_path / "run"), "--steps", "2"]
    job += settings(*TINY_MODEL, "train.global_batch_size=64", 'train.device="cpu"')
    job += settings("dist.timeout_s=60")  # before: the good node's wait, then its traceback
    started = time.monotonic()
    nodes = [
        subprocess.Popen(
            torchrun_command(["--data", str(data), *job], 1, nnodes=2, rdzv_endpoint=endpoint),
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stderr=subprocess.PIPE,
            text=True,
        )
        for data in (tiny_dataset, missing)
    ]
    good, refused = [p.communicate(timeout=300)[1] for p in nodes]
    assert [p.returncode for p in nodes] == [1, 1] and time.monotonic() - started < 50
    assert "Traceback" not in good, good[-3000:]
    assert [line for line in refused.splitlines() if line.startswith("error:")] == [
        f"error: {missing}: does not exist"
    ]
    said = [line for line in good.splitlines() if line.startswith("error:")]
    assert len(said) == 1 and re.fullmatch(
        r"error: node (\d) \(rank \1, host .+\) refused the job, so no rank starts; its output "
        + re.escape(f"says why: {missing}: does not exist"),
        said[0],
    ), good[-3000:]


def test_a_checkpoint_folder_renamed_by_hand_is_refused_by_a_rank_torchrun_started(
    tiny_dataset: Path, tmp_path: Path
) -> None:
    # `shardrec train` refused it (edca41b); a plain torchrun's ranks did not: with its only
    # checkpoint renamed step-2, they said the run "stopped before its first checkpoint" (and
    # under the same --steps started over from step 0 beside it, without a word).
    run = tmp_path / "run"
    job = ("--data", str(tiny_dataset), "--out-dir", str(run))
    tiny = settings(*TINY_MODEL, "train.global_batch_size=64", 'train.device="cpu"')
    assert run_direct_rank(*job, "--steps", "2", *tiny).returncode == 0
    renamed = run / "checkpoints" / "step-2"
    (run / "checkpoints" / "step-00000002").rename(renamed)
    assert_one_line_error(
        run_direct_rank(*job, "--steps", "4", *tiny),
        "^"
        + re.escape(
            f"error: {renamed}: a checkpoint's files in a folder not named step-NNNNNNNN, which no "
            "command reads (renamed or copied by hand?); it holds step 2: rename it "
            f"step-00000002, or move it out of {renamed.parent}"
        )
        + "$",
    )
    assert sorted(p.name for p in renamed.parent.iterdir()) == ["step-2"]
