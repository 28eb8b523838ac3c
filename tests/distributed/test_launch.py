"""The local-rank harness (trainer.distributed.local_ranks.run_local_ranks) that tests, calibration and
benchmarks share."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import time
from multiprocessing.process import BaseProcess

import pytest

from shardrec.tools.cli.common import Terminated, sigterm_as_ctrl_c
from shardrec.trainer.distributed.local_ranks import RankFailed, run_local_ranks


def _sum_of_ranks(env, offset: int) -> tuple[int, int, int]:
    import torch
    import torch.distributed as dist

    total = torch.tensor([env.rank])
    dist.all_reduce(total)  # a real collective: the ranks joined one group
    return env.rank, env.world_size, int(total) + offset


def _fails_on_rank_one(env) -> int:
    if env.rank == 1:
        raise ValueError("bad input on rank one")
    return env.rank


def test_results_come_back_in_rank_order() -> None:
    assert run_local_ranks(_sum_of_ranks, 3, 10) == [(0, 3, 13), (1, 3, 13), (2, 3, 13)]


def _threads(env) -> int:
    import torch

    return torch.get_num_threads()


def test_the_ranks_share_the_cores_out_as_torchruns_ranks_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Before, each rank kept torch's default, a thread per core: 4 ranks on 2 cores ran 8 threads,
    # the idle ones spinning on the cores the others computed on (test_managed_tables' 4 ranks:
    # 46 CPU s, 25 with the cores shared out).
    from shardrec.trainer.distributed import devices

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(devices, "usable_cores", lambda: 10)
    assert run_local_ranks(_threads, 2) == [5, 5]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert devices.rank_threads(2) is None  # the user's own, which torch reads in each rank


def test_a_failing_rank_is_named_with_its_error() -> None:
    with pytest.raises(RankFailed) as caught:
        run_local_ranks(_fails_on_rank_one, 2, timeout_s=120)
    assert caught.value.rank == 1
    assert caught.value.reason == "ValueError: bad input on rank one"
    assert "Traceback" in str(caught.value)


def test_a_kill_while_the_ranks_start_ends_the_ranks_already_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # bench plan's reality check and calibration take a kill (sigterm_as_ctrl_c) as a stop: one
    # arriving after rank 0 started and before rank 1 did left rank 0 waiting for rank 1 at the
    # rendezvous, and the command, on its way out, waiting for rank 0 (a non-daemon child).
    start, starts = BaseProcess.start, []

    def start_the_second_after_a_kill(process: BaseProcess) -> None:
        starts.append(process)
        if len(starts) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)  # a handler let run has raised by now
        start(process)

    monkeypatch.setattr(BaseProcess, "start", start_the_second_after_a_kill)
    try:
        with sigterm_as_ctrl_c(), pytest.raises(Terminated):
            run_local_ranks(_sum_of_ranks, 2, 0, collective_timeout_s=300)
        assert multiprocessing.active_children() == [], "a rank outlived the stopped run"
    finally:
        for left in multiprocessing.active_children():
            left.kill()
            left.join()


def test_ranks_meet_even_where_another_process_takes_a_free_port_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A port found free is free only until another process binds it: CI's other test worker, whose
    # ranks bind and connect on ports of the kernel's choosing, as these ranks import torch before
    # rank 0 listens. Here the port free_port would find is taken at once.
    from shardrec.trainer.distributed import local_ranks

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(local_ranks, "free_port", lambda: taken.getsockname()[1])
        results = run_local_ranks(_sum_of_ranks, 2, 0, timeout_s=120, collective_timeout_s=20)
    assert results == [(0, 2, 1), (1, 2, 1)]
