"""The local-rank harness (trainer.distributed.local_ranks.run_local_ranks) that tests, calibration and
benchmarks share."""

from __future__ import annotations

import pytest

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


def test_a_failing_rank_is_named_with_its_error() -> None:
    with pytest.raises(RankFailed) as caught:
        run_local_ranks(_fails_on_rank_one, 2, timeout_s=120)
    assert caught.value.rank == 1
    assert caught.value.reason == "ValueError: bad input on rank one"
    assert "Traceback" in str(caught.value)
