"""What the per-rank memory estimate counts besides the tables' own bytes, per device kind.

A rank's estimate (cost.PlanCost.memory_bytes) is the sum of
- per shard: its weights and sparse optimizer state (exact, from the shapes; cost_model.py), and a
  step's input ids and pooled outputs (`io_copies` copies);
- per data-parallel table: its weights `replicated_copies` times (the weights, the dense
  gradient backward writes, DDP's bucket) plus its optimizer state;
- per rank, the same on every rank (`fixed_bytes` here): the dense layers' parameters with
  their gradients, DDP buckets and optimizer state; their activations for the local batch;
  the input KeyedJaggedTensor's copies that torchrec reserves on CUDA; `framework_bytes`
  (process group and its buffers, autograd, thread pools, what the allocator keeps); and on CPU
  the managed tables' id maps (on CUDA they are host memory: cost_model.evaluate).

The copies and the framework figure are MemoryModel constants: on CPU measured with
`shardrec bench plan-reality` (each rank's peak resident set while a plan is built, sharded
and trained), on CUDA torchrec's storage estimator and reservation (dense parameters x6, input
ids x20, nothing for the CUDA context: the 15% reserve covers it). A calibration profile may
carry constants measured on the machine at hand (topology.load_profile).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if (
    TYPE_CHECKING
):  # torch where a model is measured: topologies and plan files (`plan show`) need none
    import torch

MiB = 2**20

DENSE_OPTIMIZER_STATE = {"adagrad": 1.0, "adam": 2.0, "sgd": 0.0}
"""Copies of the dense parameters each dense optimizer keeps (trainer.optim.DENSE_OPTIMIZERS)."""


@dataclass(frozen=True)
class MemoryModel:
    """Constants of the per-rank memory estimate that are not byte counts of a shape."""

    framework_bytes: float = 0.0
    """Fixed per rank: process group, autograd, thread pools, allocator retention."""
    replicated_copies: float = 3.0
    """A data-parallel table's weights at the peak: weights, backward's gradient, DDP's bucket."""
    io_copies: float = 1.0
    """Copies of a shard's per-step input ids and pooled outputs (forward and gradient) alive at
    once."""
    dense_copies: float = 0.0
    """The dense parameters at the peak, optimizer state included; 0: counted from the optimizer
    (parameters, gradients, DDP buckets: 3, plus DENSE_OPTIMIZER_STATE)."""
    activation_copies: float = 2.0
    """The dense layers' activations per sample: kept for backward, and their gradients."""
    input_copies: float = 0.0
    """Copies of the input KeyedJaggedTensor's ids per rank (torchrec reserves 20 on CUDA:
    2 pipelined batches, 10 internal copies each)."""

    def dense_multiplier(self, optimizer: str) -> float:
        if self.dense_copies:
            return self.dense_copies
        return 3.0 + DENSE_OPTIMIZER_STATE.get(optimizer, 1.0)


MEMORY_MODELS: dict[str, MemoryModel] = {
    # Least squares over 52 ranks of two `bench plan-reality` runs (2 gloo ranks, 26 tables of
    # 0.03 and 2.28 GiB, batch 2048) of the peak beyond the exact terms: 37.8 MiB + 1.00 x IO.
    "cpu": MemoryModel(framework_bytes=40 * MiB, replicated_copies=3.0, io_copies=1.0),
    # torchrec's HeuristicalStorageReservation: 6 x dense parameters, 20 x input ids (KJT).
    "cuda": MemoryModel(
        framework_bytes=0.0,
        replicated_copies=3.0,
        io_copies=1.0,
        dense_copies=6.0,
        input_copies=20.0,
    ),
}

MODEL_KEYS = tuple(MemoryModel.__dataclass_fields__)


@dataclass(frozen=True)
class DenseFootprint:
    """The dense part of the model as the memory estimate sees it."""

    param_bytes: int = 0
    """Parameters outside the embedding tables (dense arch, interaction, over arch)."""
    activation_bytes_per_sample: int = 0
    """Outputs of the dense layers for one sample (what backward keeps)."""
    optimizer: str = "adagrad"
    """The dense optimizer (trainer.optim.DENSE_OPTIMIZERS)."""
    id_map_bytes: int = 0
    """The managed tables' id maps, a replica on every rank (embeddings.managed.map_memory): in
    the rank's memory on CPU, in host memory on CUDA."""


def dense_footprint(model: torch.nn.Module, optimizer: str = "adagrad") -> DenseFootprint:
    """Parameters and per-sample activations of a model's layers outside its embedding tables.

    Works on a model built on the meta device (nothing allocated): parameters are counted by
    shape, activations as the output width of every linear layer, plus what a module says of its
    own (`activation_bytes_per_sample`: a sequence model's attention, which grows with the square
    of its length).
    """
    import torch
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    tables = {
        id(p)
        for m in model.modules()
        if isinstance(m, (EmbeddingBagCollection, EmbeddingCollection))
        for p in m.parameters()
    }
    params = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in tables)
    widths = sum(m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))
    declared = sum(
        int(m.activation_bytes_per_sample())
        for m in model.modules()
        if callable(getattr(m, "activation_bytes_per_sample", None))
    )
    return DenseFootprint(int(params), int(widths * 4) + declared, optimizer)


def fixed_bytes(
    model: MemoryModel,
    dense: DenseFootprint,
    local_batch: float,
    ids_per_sample: float,
    id_bytes: int = 8,
) -> float:
    """Bytes every rank holds whatever the placement: dense layers, activations, inputs,
    framework."""
    return (
        model.framework_bytes
        + dense.param_bytes * model.dense_multiplier(dense.optimizer)
        + dense.activation_bytes_per_sample * local_batch * model.activation_copies
        + model.input_copies * local_batch * ids_per_sample * id_bytes
    )
