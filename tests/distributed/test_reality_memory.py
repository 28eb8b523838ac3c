"""`bench plan-reality` measures each rank's memory: the process's peak resident set, not tensor sizes."""

from __future__ import annotations

import pytest

from shardrec.sharding import layouts, suites
from shardrec.sharding.plan_io import PLAN_SCHEMA_VERSION, PlanFile, plan_fingerprint
from shardrec.tools.bench.reality import measure_plans, peak_growth, start_peak_window

ROWS, DIM, TABLES = 40_000, 32, 4
TABLE_BYTES = ROWS * DIM * 4


def test_peak_window_sees_a_new_allocation_and_forgets_an_old_one() -> None:
    import torch

    old = torch.ones(TABLE_BYTES // 4)  # touched pages: resident
    del old
    start = start_peak_window()
    assert peak_growth(start) < TABLE_BYTES // 2  # the freed tensor's peak is not carried into the new window
    new = torch.ones(TABLE_BYTES // 4)
    assert peak_growth(start) >= TABLE_BYTES * 0.9
    del new


@pytest.mark.slow
def test_measured_memory_is_each_rank_process_peak() -> None:
    configs = [suites.table_config(i, ROWS, DIM) for i in range(TABLES)]
    fp = plan_fingerprint(configs, 2, 256, "cpu")
    on_rank0 = [layouts.table_wise(config, 0, "fused") for config in configs]
    row_wise = [layouts.row_wise(config, 2, "fused") for config in configs]
    texts = [PlanFile(PLAN_SCHEMA_VERSION, fp, placed).to_json() for placed in (on_rank0, row_wise)]
    first, second = measure_plans(configs, texts, world_size=2, local_batch=128, steps=2)
    for m in (first, second):
        assert len(m.memory_bytes) == len(m.held_bytes) == 2
        # A process that built what it holds grew by more than the tensors' bytes (batches, buffers, gloo).
        assert all(grown > held for grown, held in zip(m.memory_bytes, m.held_bytes))
    # All tables on rank 0: weights + row-wise Adagrad state there, nothing on rank 1.
    assert first.held_bytes[1] == 0 and first.held_bytes[0] >= TABLES * TABLE_BYTES
    assert first.memory_bytes[0] - first.memory_bytes[1] >= 0.8 * TABLES * TABLE_BYTES
    # Row-wise halves rank 0's tables, and its measured peak drops with them.
    assert second.memory_bytes[0] < first.memory_bytes[0] - 0.3 * TABLES * TABLE_BYTES
