"""Closed-form communication of a placement: bytes each rank sends per training step.

Conventions (those of torchrec's pooled-embedding sharding, fp32 embeddings):

- Input distribution is an all-to-all of the KeyedJaggedTensor: per sample one length
  (`length_bytes`) and `pooling` ids (`id_bytes` each) travel from the rank that read the
  sample to every rank that holds a shard the sample needs.
- Table-wise, column-wise and table-column-wise shards return pooled [samples x cols]
  blocks by all-to-all; the backward pass sends the gradients the other way.
- Row-wise shards each compute a partial sum for the whole global batch; a reduce-scatter
  hands every rank its own samples (backward: an all-gather of the gradients).
- Table-row-wise reduce-scatters within the holder host, then all-to-alls each host's
  share of the samples to the ranks of the other hosts (backward: the reverse).
- Data-parallel tables move nothing forward; backward all-reduces the table's gradient
  (ring: 2 (W-1)/W of the table per rank).
- Each sharding type group (tables sharded the same way travel together) first exchanges
  split sizes (SPLITS_BYTES to every other rank) before its input all-to-all.
- A sequence model's unpooled table (torchrec's EmbeddingCollection) returns one row per id, not
  one per sample: its output blocks are `pooling` times larger, and a row-wise shard sends the rows
  of the ids it holds back by all-to-all instead of reduce-scattering partial sums.

Only bytes sent to *other* ranks count: what a rank "sends" to itself never leaves it.
Each function returns `{kind: per-rank bytes (numpy, length world_size)}` for one table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shardrec.sharding.cost.skew import LookupCurve, row_share
from shardrec.sharding.plan.plan_types import TablePlan

KINDS = ("all_to_all", "reduce_scatter", "all_gather", "all_reduce")
SPLITS_BYTES = 3 * 8
"""Before the ids of a sharding type group, each rank tells every other rank how many
lengths and ids (and the batch size) it will send: three int64 per destination."""


def collectives_per_step(sharding_types: set[str], num_hosts: int = 1) -> int:
    """Collectives the sharding type groups run per step, as tests/distributed/test_comm_volume.py
    counts them: split sizes, lengths and ids all-to-alls, then the output collective forward and
    backward (5); table-row-wise across hosts adds the cross-host all-to-all both ways (7);
    data-parallel tables only all-reduce their gradients, bucketed by DDP (1)."""
    count = 0
    for st in sharding_types:
        if st == "data_parallel":
            count += 1
        elif st == "table_row_wise" and num_hosts > 1:
            count += 7
        else:
            count += 5
    return count


@dataclass(frozen=True)
class Workload:
    """What one training step moves, independent of the placement."""

    global_batch_size: int
    world_size: int
    elem_bytes: int = 4
    """Bytes per embedding value (fp32 weights, pooled outputs and gradients)."""
    id_bytes: int = 8
    """Bytes per id in the input all-to-all (int64)."""
    length_bytes: int = 4
    """Bytes per sample length in the input all-to-all."""

    @property
    def local_batch(self) -> float:
        return self.global_batch_size / self.world_size


def _zeros(world_size: int) -> dict[str, np.ndarray]:
    return {k: np.zeros(world_size) for k in KINDS}


def _input_bytes(w: Workload, pooling: float, share: float) -> float:
    """Bytes one rank sends to one shard holder: every sample's length, plus the ids that shard
    owns."""
    return w.local_batch * (w.length_bytes + pooling * w.id_bytes * share)


def table_comm_bytes(
    t: TablePlan,
    rows: int,
    dim: int,
    pooling: float,
    w: Workload,
    local_world_size: int,
    curve: LookupCurve | None = None,
    unpooled: bool = False,
) -> dict[str, np.ndarray]:
    """Bytes each rank sends for one table per step (forward + backward), by collective kind.

    `curve`: how lookups spread over rows (skew.py) when ids are frequency-ordered; None: evenly.
    `unpooled`: a sequence model's table, one output row per id.
    """
    W, b, e = w.world_size, w.local_batch, w.elem_bytes
    rows_out = pooling if unpooled else 1.0  # output rows per sample
    out = _zeros(W)
    a2a = out["all_to_all"]
    st = t.sharding_type
    if st == "data_parallel":
        out["all_reduce"][:] = 2.0 * (W - 1) / W * rows * dim * e if W > 1 else 0.0
        return out
    if st in ("table_wise", "column_wise", "table_column_wise"):
        for s in t.shards:
            # Input: every other rank sends its samples' ids to the holder.
            a2a += _input_bytes(w, pooling, 1.0)
            a2a[s.rank] -= _input_bytes(w, pooling, 1.0)
            # Output: the holder sends each other rank its pooled block; backward: gradients back.
            a2a[s.rank] += (W - 1) * b * rows_out * s.cols * e
            a2a += b * rows_out * s.cols * e
            a2a[s.rank] -= b * rows_out * s.cols * e
        return out
    if st == "row_wise" and unpooled:
        for s in t.shards:
            share = row_share(curve, s.row_offset, s.rows, rows)
            a2a += _input_bytes(w, pooling, share)
            a2a[s.rank] -= _input_bytes(w, pooling, share)
            # The holder returns the rows of every other rank's ids in its block; backward, each
            # rank sends their gradients back to it.
            a2a[s.rank] += (W - 1) * b * pooling * share * dim * e
            a2a += b * pooling * share * dim * e
            a2a[s.rank] -= b * pooling * share * dim * e
        return out
    if st == "row_wise":
        for s in t.shards:
            share = row_share(curve, s.row_offset, s.rows, rows)
            a2a += _input_bytes(w, pooling, share)
            a2a[s.rank] -= _input_bytes(w, pooling, share)
        # Each rank's partial [global batch x dim] is reduce-scattered: it sends every other
        # rank that rank's samples; backward all-gathers the same volume.
        out["reduce_scatter"][:] = (W - 1) * b * dim * e
        out["all_gather"][:] = (W - 1) * b * dim * e
        return out
    if st == "table_row_wise":
        H = local_world_size
        host_ranks = [s.rank for s in t.shards]
        for s in t.shards:
            share = row_share(curve, s.row_offset, s.rows, rows)
            a2a += _input_bytes(w, pooling, share)
            a2a[s.rank] -= _input_bytes(w, pooling, share)
        per_host_rank = w.global_batch_size / H
        hosts = W // H
        # Intra-host reduce-scatter of the [global batch x dim] partials leaves host rank j the
        # sums of the samples read by rank j of every host; it sends each other host's rank j
        # its b samples. Backward, every rank of another host returns its b gradients to the
        # holder host's rank with its local index.
        a2a += b * dim * e
        for r in host_ranks:
            out["reduce_scatter"][r] += (H - 1) * per_host_rank * dim * e
            out["all_gather"][r] += (H - 1) * per_host_rank * dim * e
            a2a[r] += (hosts - 1) * b * dim * e - b * dim * e
        return out
    raise ValueError(f"table {t.name}: unknown sharding_type {st!r}")


def step_comm_bytes(
    table_plans: list[TablePlan],
    rows: dict[str, int],
    dims: dict[str, int],
    pooling: dict[str, float],
    w: Workload,
    local_world_size: int,
    curves: dict[str, LookupCurve] | None = None,
    unpooled: frozenset[str] = frozenset(),
) -> dict[str, np.ndarray]:
    """Per-rank bytes per collective kind for a whole placement, split-size exchanges included;
    `unpooled`: the names of a sequence model's tables."""
    total = _zeros(w.world_size)
    curves = curves or {}
    for table_plan in table_plans:
        name = table_plan.name
        sent = table_comm_bytes(
            table_plan,
            rows[name],
            dims[name],
            pooling.get(name, 1.0),
            w,
            local_world_size,
            curves.get(name),
            name in unpooled,
        )
        for kind, volume in sent.items():
            total[kind] += volume
    total["all_to_all"] += group_overhead_bytes(table_plans, w.world_size)
    return total


def group_overhead_bytes(table_plans: list[TablePlan], world_size: int) -> float:
    """Split-size exchange of every sharding type group with an input all-to-all, per rank."""
    groups = {plan.sharding_type for plan in table_plans if plan.sharding_type != "data_parallel"}
    return len(groups) * SPLITS_BYTES * (world_size - 1)
