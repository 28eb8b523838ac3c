"""torchrec's estimators as shardrec feeds them: the sparse optimizer's state is in their storage
figures (torchrec prices none for a weight not marked with its optimizer, a class of bug torchrec
fixed in its storage estimator)."""

from __future__ import annotations

import pytest

from shardrec.sharding import suites
from shardrec.sharding.machine.topology import build_topology
from shardrec.sharding.search.request import SearchRequest
from shardrec.sharding.torchrec.torchrec_costs import TorchrecProblem
from shardrec.sharding.torchrec.torchrec_planner import torchrec_plan

ROWS, DIM = 50_000, 16


def _request(
    optimizer: str, preset: str = "cpu-gloo", memory_bytes: int | None = None
) -> SearchRequest:
    configs = [suites.table_config(0, ROWS, DIM), suites.table_config(1, 1000, DIM)]
    return SearchRequest(
        configs=configs,
        topology=build_topology(preset, 2, memory_bytes=memory_bytes),
        global_batch_size=2048,
        pooling={c.name: 1.0 for c in configs},
        optimizer=optimizer,
    )


def test_torchrec_storage_counts_the_sparse_optimizer_state() -> None:
    mem = {
        opt: TorchrecProblem(_request(opt)).piece(0, 1).mem
        for opt in ("sgd", "rowwise_adagrad", "adam")
    }
    assert mem["rowwise_adagrad"] - mem["sgd"] == ROWS * 4  # one float per row
    assert mem["adam"] - mem["sgd"] == 2 * ROWS * DIM * 4  # two per weight


def test_torchrec_plan_refuses_what_fits_only_without_optimizer_state() -> None:
    # 4.5 MB usable per rank: table 0 is 3.35 MB with its IO under SGD, 9.75 MB with Adam's two
    # moments (4.9 MB per rank even row-wise). Priced without the optimizer, Adam would fit too.
    memory = int(4.5e6 / 0.85)
    assert torchrec_plan(_request("sgd", memory_bytes=memory))
    with pytest.raises(Exception, match="(?i)storage"):
        torchrec_plan(_request("adam", memory_bytes=memory))
