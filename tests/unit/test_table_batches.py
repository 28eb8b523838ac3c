"""fbgemm's step counters (Adam's bias correction reads them) leave a table batch (TBE) with the
checkpoint's counts per table and come back into TBEs grouped otherwise; the kernel then counts on
from the restored value, not from 0. Real fbgemm CPU TBEs (row-wise Adagrad: CPU has no Adam
kernel, but the counter is the same buffer, counted the same way)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)

from shardrec.embeddings.table_batches import (
    host_placement,
    kept,
    read_step_counters,
    restore_step_counters,
    table_batches,
)


def _tbe(*tables: str) -> SplitTableBatchedEmbeddingBagsCodegen:
    return SplitTableBatchedEmbeddingBagsCodegen(
        [(10, 4, EmbeddingLocation.HOST, ComputeDevice.CPU) for _ in tables],
        optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=0.1,
        table_names=list(tables),
    )


def _forward(tbe: SplitTableBatchedEmbeddingBagsCodegen, times: int) -> None:
    n = len(tbe.table_names)
    for _ in range(times):
        tbe(torch.arange(n), torch.arange(n + 1)).sum().backward()


def test_counters_are_read_per_table_and_restored_into_other_groupings() -> None:
    saved_batches = [_tbe("a", "b"), _tbe("c")]
    for tbe in saved_batches:
        _forward(tbe, 5)
    counters = read_step_counters(saved_batches)
    assert {t: c.tolist() for t, c in counters.items()} == {"a": [5], "b": [5], "c": [5]}
    assert all(c.dtype == torch.int64 and c.device.type == "cpu" for c in counters.values())
    _forward(saved_batches[0], 1)  # a copy: the saved counts do not move with the TBE
    assert counters["a"].item() == 5

    # Resumed under another plan: a and c share a TBE, d was data-parallel (no count of its own).
    resumed = [_tbe("a", "c"), _tbe("d")]
    restore_step_counters(resumed, {t: int(c.item()) for t, c in counters.items()})
    assert [int(tbe.iter.item()) for tbe in resumed] == [5, 5]
    _forward(resumed[0], 2)
    # The kernel's own count (fbgemm reads the buffer back at the first forward) went on from 5.
    assert int(resumed[0].iter.item()) == 7 and int(resumed[0].iter_cpu.item()) == 7


def test_disagreeing_counts_of_one_batch_take_the_largest_and_say_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tbe = _tbe("a", "b")
    restore_step_counters([tbe], {"a": 3, "b": 9})
    assert int(tbe.iter.item()) == 9
    assert "tables a, b were saved with step counters [3, 9]" in caplog.text


def test_table_batches_are_found_through_the_fused_optimizers() -> None:
    a, b = _tbe("a"), _tbe("b")
    # torchrec's tree: CombinedOptimizers (public `optimizers`) of one fused optimizer per TBE.
    leaf = SimpleNamespace
    tree = SimpleNamespace(
        optimizers=[("", SimpleNamespace(optimizers=[("", leaf(_emb_module=a))])), ("", leaf())]
    )
    tree.optimizers.append(("", leaf(_emb_module=b)))
    tree.optimizers.append(("", leaf(_emb_module=a)))  # the same TBE once
    found = table_batches(tree)
    assert len(found) == 2 and {id(t) for t in found} == {id(a), id(b)}


def test_forwards_inside_kept_leave_the_counts_as_they_were() -> None:
    tbe = _tbe("a")
    _forward(tbe, 3)
    with kept([tbe]):
        _forward(tbe, 4)  # an evaluation
    _forward(tbe, 1)
    assert int(tbe.iter.item()) == 4 and int(tbe.iter_cpu.item()) == 4


def test_a_table_batch_without_uvm_weights_is_not_in_host_memory() -> None:
    # fbgemm's CPU kernels keep weights in their host buffer, never in UVM (CUDA managed memory).
    assert host_placement(_tbe("a", "b")) is None
