"""fbgemm's table batches of a sharded model, and their step counter: the optimizer state that no
state dict holds.

Each table batch of a rank (fbgemm's SplitTableBatchedEmbeddingBagsCodegen, a TBE: the tables
torchrec groups into one kernel) counts its forward calls in a buffer, `iter` (and a CPU copy,
`iter_cpu`, that its kernels are handed), and its Adam (LAMB, partial row-wise Adam) kernel takes
its bias correction from the count: 1 - beta^iter. torchrec's state_dict holds the weights and its
fused optimizer's the moments (fbgemm's get_optimizer_state()), not the counter: a resumed TBE
would count from 0 again and its first updates be several times too large.

So the checkpoint keeps the counter, per table, and a resumed TBE takes the count of its tables,
whatever plan or world size cut them before. fbgemm counts evaluation forwards too; the trainer
keeps the count across its evaluations (`kept`), so that the counter is the number of optimizer
steps, as torch.optim.Adam's `step` of the data-parallel tables is, and a run evaluated on
another schedule (a `--steps 8` run continued to 16) updates as the uninterrupted run does. Every
TBE of a run then holds the same count; a table with no count of its own (data-parallel when
saved) takes the checkpoint's largest. Row-wise Adagrad and SGD kernels do not read the counter
(checked: the same updates at any count); it is kept for them too, one number per table.
fbgemm's other buffers outside its optimizer state (`prev_iter`, `row_counter`, `max_counter`)
exist for counter-based and global weight decay, which shardrec never configures.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    SplitTableBatchedEmbeddingBagsCodegen,
)

logger = logging.getLogger(__name__)


def table_batches(fused_optimizer: Any) -> list[SplitTableBatchedEmbeddingBagsCodegen]:
    """The TBEs of this rank's fused tables, found through the sharded model's `fused_optimizer`
    (data-parallel tables have none: a torch optimizer steps them).

    torchrec has no public way to them: its sharded collection keeps its lookups in a plain list
    (not submodules), and the fused optimizer it builds per TBE (EmbeddingFusedOptimizer, reached
    through CombinedOptimizer's public `optimizers`) keeps its TBE as `_emb_module`, the one
    private attribute read here."""
    found: list[SplitTableBatchedEmbeddingBagsCodegen] = []
    pending = [fused_optimizer]
    while pending:
        optimizer = pending.pop(0)
        inner = getattr(optimizer, "optimizers", None)
        if inner is not None:  # a CombinedOptimizer
            pending.extend(o for _, o in inner)
            continue
        tbe = getattr(optimizer, "_emb_module", None)
        if isinstance(tbe, SplitTableBatchedEmbeddingBagsCodegen) and tbe not in found:
            found.append(tbe)
    return found


def _tables(tbe: SplitTableBatchedEmbeddingBagsCodegen) -> list[str]:
    # torchrec names the TBE's tables (a column-cut table may appear once per shard).
    return list(dict.fromkeys(tbe.table_names or []))


def host_placement(tbe: SplitTableBatchedEmbeddingBagsCodegen) -> str | None:
    """Where a TBE that keeps weights in host memory (fbgemm's UVM buffer, torchrec's fused_uvm
    and fused_uvm_caching kernels) holds them, read from its own buffers, in words; None for one
    whose weights are all in HBM (or on the CPU)."""
    if tbe.weights_uvm.numel() == 0:
        return None
    rows = sum(int(spec[0]) for spec in tbe.embedding_specs)
    cache_rows = int(tbe.lxu_cache_weights.shape[0]) if tbe.lxu_cache_weights.numel() else 0
    cache = f"an HBM cache of {cache_rows:,} rows" if cache_rows else "no cache"
    return f"table batch {', '.join(_tables(tbe))}: {rows:,} rows in host memory (UVM), {cache}"


def read_step_counters(
    batches: list[SplitTableBatchedEmbeddingBagsCodegen],
) -> dict[str, torch.Tensor]:
    """Table -> its TBE's step counter, a [1] int64 tensor on the CPU (a copy)."""
    counters = {}
    for tbe in batches:
        count = tbe.iter.detach().to("cpu", copy=True)
        for table in _tables(tbe):
            counters[table] = count
    return counters


def _set_count(tbe: SplitTableBatchedEmbeddingBagsCodegen, count: int) -> None:
    tbe.set_optimizer_step(count)  # the buffer checkpoints read
    # The copy the kernels are handed: fbgemm refreshes it from the buffer only while it is 0.
    tbe.iter_cpu.fill_(count)


@contextmanager
def kept(batches: list[SplitTableBatchedEmbeddingBagsCodegen]) -> Iterator[None]:
    """Forwards inside (an evaluation's) leave the TBEs' counts as they found them: they are no
    optimizer steps."""
    counts = [int(tbe.iter.item()) for tbe in batches]  # one sync per evaluation on CUDA
    try:
        yield
    finally:
        for tbe, count in zip(batches, counts):
            _set_count(tbe, count)


def restore_step_counters(
    batches: list[SplitTableBatchedEmbeddingBagsCodegen], saved: dict[str, int]
) -> None:
    """Set each TBE's counter to the saved count of its tables (see the module docstring)."""
    if not saved:
        return
    everywhere = max(saved.values())
    for tbe in batches:
        counts = {saved[t] for t in _tables(tbe) if t in saved}
        if len(counts) > 1:
            logger.warning(
                "tables %s were saved with step counters %s: their table batch takes the largest",
                ", ".join(_tables(tbe)),
                sorted(counts),
            )
        _set_count(tbe, max(counts) if counts else everywhere)
