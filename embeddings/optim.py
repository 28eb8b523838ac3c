"""The sparse (embedding) optimizer as torch runs it: the algorithms, their settings, and how tables
get them.

Tables on the fused kernel get the optimizer fused into the embedding kernel's backward: it is
marked on the unsharded weights and torchrec's sharders pick it up. Data-parallel tables get a plain
torch optimizer of the same algorithm, stepped after backward with the dense layers'. What is known
of each optimizer without torch (names, state sizes, devices) is sparse_optimizers.py's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.distributed.optim import _apply_optimizer_in_backward
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from shardrec.embeddings.tables import is_unpooled, table_weight_fqn

TORCH_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "rowwise_adagrad": RowWiseAdagrad,
    "adam": torch.optim.Adam,
    "sgd": torch.optim.SGD,
    # torchrec maps torch's Adagrad to fbgemm's EXACT_ADAGRAD on fused tables, and it steps
    # data-parallel ones itself (torchrec.optim.Adagrad, the class MLPerf's rules name, is a
    # placeholder that cannot).
    "adagrad": torch.optim.Adagrad,
}


def optimizer_kwargs(optimizer: str, lr: float, eps: float) -> dict[str, Any]:
    """Keyword settings of a torch optimizer by name (sgd has no epsilon)."""
    return {"lr": lr} if optimizer == "sgd" else {"lr": lr, "eps": eps}


def attach_fused_optimizer(
    ebc: EmbeddingBagCollection | EmbeddingCollection,
    table_names: Iterable[str],
    *,
    optimizer: str,
    lr: float,
    eps: float,
) -> None:
    """Mark the named tables of an unsharded EmbeddingBagCollection (or a sequence model's
    EmbeddingCollection; on the meta device, before sharding) so that sharding fuses `optimizer`
    into their embedding kernel's backward.

    Args:
        ebc: the collection, before sharding.
        table_names: the tables on the fused compute kernel.
        optimizer: a name of sparse_optimizers.NAMES.
        lr, eps: its learning rate and epsilon.
    """
    modules = ebc.embeddings if isinstance(ebc, EmbeddingCollection) else ebc.embedding_bags
    weights = [modules[name].weight for name in table_names]
    if weights:
        _apply_optimizer_in_backward(
            TORCH_OPTIMIZERS[optimizer], weights, optimizer_kwargs(optimizer, lr, eps)
        )


def replicated_table_params(
    model: torch.nn.Module, tables: list[EmbeddingBagConfig], ebc_path: str, ec_path: str = ""
) -> dict[str, tuple[str, torch.nn.Parameter]]:
    """The table weights no fused optimizer updates (the data-parallel tables): FQN -> (table,
    weight).

    Args:
        model: the sharded model; its `named_parameters()` order is kept.
        tables: the tables of its EmbeddingBagCollection (and EmbeddingCollection).
        ebc_path: where that collection sits in `model`.
        ec_path: where a sequence model's EmbeddingCollection sits (its unpooled tables).
    """
    by_fqn = {
        table_weight_fqn(ec_path if is_unpooled(t) else ebc_path, t.name, is_unpooled(t)): t.name
        for t in tables
    }
    after_backward = in_backward_optimizer_filter(model.named_parameters(), include=False)
    return {fqn: (by_fqn[fqn], param) for fqn, param in after_backward if fqn in by_fqn}


def replicated_table_optimizer(
    params: list[torch.nn.Parameter], *, optimizer: str, lr: float, eps: float
) -> torch.optim.Optimizer:
    """The optimizer of data-parallel tables: the same algorithm and settings as the fused one."""
    return TORCH_OPTIMIZERS[optimizer](params, **optimizer_kwargs(optimizer, lr, eps))
