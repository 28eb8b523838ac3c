"""dist.agree_to_start: the ranks of a direct torchrun tell each other, through the store its
agents serve, whether they refused before any joins. Here the agents' store is one served by the
test, and each rank a process of its own, as torchrun starts them."""

from __future__ import annotations

import os
import subprocess
import sys

import torch.distributed as dist

RANK = """
import sys, time
from shardrec.trainer.distributed.dist import agree_to_start
time.sleep(float(sys.argv[2]))
print(repr(agree_to_start(sys.argv[1] or None, 60)))
"""


def _round(port: int, *ranks: tuple[str, float]) -> list[str]:
    """What agree_to_start returns on each rank of one round (`ranks`: its refusal, '' for none,
    and how late it answers), as torchrun's agents start them for the same restart count."""
    env = {
        **os.environ,
        **{"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(len(ranks))},
        **{"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "job"},
        **{"TORCHELASTIC_RESTART_COUNT": "0", "LOCAL_RANK": "0"},
    }
    started = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, refusal, str(late)],
            env={**env, "RANK": str(rank), "GROUP_RANK": str(rank)},
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank, (refusal, late) in enumerate(ranks)
    ]
    return [p.communicate(timeout=120)[0].strip().splitlines()[-1] for p in started]


def test_a_round_torchrun_restarts_uncounted_does_not_read_the_last_rounds_answers() -> None:
    # torchrun restarts the workers when a node joins an elastic job without counting a restart
    # (TORCHELASTIC_RESTART_COUNT unchanged): the ranks meet under the same keys of the same
    # store. Before, the first round's answers stayed there: rank 0 read rank 1's old "ready",
    # returned None and went on to join the group while rank 1 refused.
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    assert _round(store.port, ("", 0), ("", 0)) == ["None", "None"]
    second = _round(store.port, ("", 0), ("/data: does not exist", 3))
    assert second == [
        "'node 1 (rank 1, host "
        + os.uname().nodename
        + ") refused the job, so no rank starts; its output says why: /data: does not exist'",
        "None",
    ]
