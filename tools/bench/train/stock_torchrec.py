"""The stock-torchrec baseline of `shardrec bench train`: a DLRM trained the way torchrec's own
examples train one, with no shardrec code on the training path.

What a torchrec user writes: `torchrec.models.dlrm`'s DLRM (DLRM_DCN for dcnv2) wrapped in
DLRMTrain (mean BCE over the rank's batch), the EmbeddingBagCollection on the meta device, the
stock EmbeddingBagCollectionSharder with the sparse optimizer in its fused parameters, torchrec's
EmbeddingShardingPlanner (on CPU it picks among the sharding types its policy allows there),
DistributedModelParallel, a torch.optim dense optimizer in KeyedOptimizerWrapper combined with
the model's fused optimizer, and TrainPipelineSparseDist over torchrec `Batch`es.

The harness (tools/bench/train/train_ranks.py) hands it the batches and times it; the only shardrec
module this file may import is `shardrec.tools.bench.train.timing` (tests/unit/test_bench_stock.py
checks it). It runs in fp32: torchrec's examples have no mixed precision.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.datasets.utils import Batch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from shardrec.tools.bench.train.timing import timed_window

# The sparse optimizer by shardrec's name -> fbgemm's fused kind (what the sharder's fused
# parameters take); the deterministic ("exact") variants, as torchrec's examples use.
FUSED_OPTIMIZERS = {
    "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    "adam": EmbOptimType.ADAM,
    "sgd": EmbOptimType.EXACT_SGD,
    "adagrad": EmbOptimType.EXACT_ADAGRAD,
}
DENSE_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    "adagrad": torch.optim.Adagrad,
    "adam": torch.optim.Adam,
    "sgd": torch.optim.SGD,
}


@dataclass(frozen=True)
class StockModel:
    """The model shape: one sum-pooled table per sparse feature."""

    arch: str
    """dlrm or dcnv2."""
    num_dense: int
    """Dense input features."""
    tables: tuple[tuple[str, int], ...]
    """(feature name, rows) per table, in the batches' feature order."""
    embedding_dim: int
    dense_arch: tuple[int, ...]
    over_arch: tuple[int, ...]
    dcn_layers: int = 3
    dcn_low_rank: int = 32


@dataclass(frozen=True)
class StockOptim:
    """Optimizer kinds and settings (the names shardrec's config uses)."""

    sparse: str
    sparse_lr: float
    dense: str
    dense_lr: float
    eps: float = 1e-8


def _dense_kwargs(kind: str, lr: float, eps: float) -> dict[str, float]:
    return {"lr": lr} if kind == "sgd" else {"lr": lr, "eps": eps}


def build_dlrm(
    spec: StockModel, seed: int, device: torch.device = torch.device("cpu")
) -> DLRMTrain:
    """torchrec's DLRM (or DLRM_DCN) over a meta-device EmbeddingBagCollection, in DLRMTrain."""
    torch.manual_seed(seed)
    configs = [
        EmbeddingBagConfig(
            name=f"t_{name}",
            embedding_dim=spec.embedding_dim,
            num_embeddings=rows,
            feature_names=[name],
        )
        for name, rows in spec.tables
    ]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    common = dict(
        embedding_bag_collection=ebc,
        dense_in_features=spec.num_dense,
        dense_arch_layer_sizes=list(spec.dense_arch),
        over_arch_layer_sizes=list(spec.over_arch),
        dense_device=device,
    )
    if spec.arch == "dcnv2":
        model: DLRM = DLRM_DCN(
            dcn_num_layers=spec.dcn_layers, dcn_low_rank_dim=spec.dcn_low_rank, **common
        )
    elif spec.arch == "dlrm":
        model = DLRM(**common)
    else:
        raise ValueError(f"model arch {spec.arch!r} is not one of dlrm, dcnv2")
    return DLRMTrain(model)


class StockTrainer:
    """One rank of the stock torchrec training loop (call on every rank of the process group)."""

    def __init__(
        self,
        spec: StockModel,
        optim: StockOptim,
        local_batch_size: int,
        local_world_size: int,
        seed: int = 0,
        device: torch.device = torch.device("cpu"),
    ) -> None:
        if optim.sparse not in FUSED_OPTIMIZERS or optim.dense not in DENSE_OPTIMIZERS:
            raise ValueError(
                f"optimizers {optim.sparse!r} / {optim.dense!r}: sparse one of {', '.join(FUSED_OPTIMIZERS)}, "
                f"dense one of {', '.join(DENSE_OPTIMIZERS)}"
            )
        if optim.sparse == "adam" and device.type == "cpu":
            # fbgemm's CPU kernel asserts on it; say so before any rank builds a model.
            raise ValueError(
                "sparse optimizer 'adam': torchrec's fused CPU kernel does not support it "
                "(use rowwise_adagrad, sgd or adagrad)"
            )
        fused = {"optimizer": FUSED_OPTIMIZERS[optim.sparse], "learning_rate": optim.sparse_lr}
        if optim.sparse != "sgd":
            fused["eps"] = optim.eps
        sharders = [EmbeddingBagCollectionSharder(fused_params=fused)]
        module = build_dlrm(spec, seed, device)
        topology = Topology(
            world_size=dist.get_world_size(),
            compute_device=device.type,
            local_world_size=local_world_size,
        )
        planner = EmbeddingShardingPlanner(topology=topology, batch_size=local_batch_size)
        self.plan = planner.collective_plan(module, sharders, dist.GroupMember.WORLD)
        self.model = DistributedModelParallel(
            module, device=device, plan=self.plan, sharders=sharders
        )  # type: ignore[arg-type]
        dense = KeyedOptimizerWrapper(
            dict(in_backward_optimizer_filter(self.model.named_parameters())),
            lambda params: DENSE_OPTIMIZERS[optim.dense](
                params, **_dense_kwargs(optim.dense, optim.dense_lr, optim.eps)
            ),
        )
        self.optimizer = CombinedOptimizer([self.model.fused_optimizer, dense])
        self.pipeline = TrainPipelineSparseDist(
            self.model, self.optimizer, device, execute_all_batches=True
        )
        self.local_batch_size = local_batch_size
        self.device = device

    def sharding_types(self) -> dict[str, str]:
        """Table -> the sharding type torchrec's planner chose."""
        return {
            table: p.sharding_type for plan in self.plan.plan.values() for table, p in plan.items()
        }  # type: ignore[union-attr]

    def train(self, batches: Iterable[Batch], steps: int) -> int:
        """Train on up to `steps` batches; returns how many ran."""
        self.model.train()
        done, it = 0, iter(itertools.islice(batches, steps))
        while True:
            try:
                self.pipeline.progress(it)
            except StopIteration:
                return done
            done += 1

    def timed(self, batches: Iterable[Batch], steps: int) -> tuple[float, float, float]:
        """(samples, wall seconds, CPU seconds of every rank) of `steps` batches per rank."""
        return timed_window(
            lambda: self.train(batches, steps),
            steps * self.local_batch_size * dist.get_world_size(),
        )

    @torch.no_grad()
    def predict(self, batches: Iterator[Batch]) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, labels) of this rank's evaluation batches."""
        self.pipeline.detach()  # the model's own forward, not the pipelined one
        self.model.eval()
        logits, labels = [], []
        for batch in batches:
            # DDP moves tensor inputs to the device, not a Batch: the pipeline moved the training
            # ones.
            _, (_, batch_logits, batch_labels) = self.model(
                batch.to(self.device, non_blocking=True)
            )
            logits.append(batch_logits.float())
            labels.append(batch_labels.float())
        self.model.train()
        return torch.cat(logits), torch.cat(labels)
