"""The models: DLRM (dot interaction) and DCNv2 (the DLRMv2 model) over one EmbeddingBagCollection.

Both read the pooled embeddings by feature name: a sharded EmbeddingBagCollection returns its
KeyedTensor keys in an order that depends on the plan, so position means nothing.

Precision (train.precision): under bf16 the dense layers and the interaction run in
torch.autocast (bf16 matmuls, fp32 weights); the embedding lookups and their all-to-all stay
outside it, and the logit is returned in fp32 so that the loss and metrics are fp32.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
from torchrec.modules.crossnet import LowRankCrossNet
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.modules.mlp import MLP
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shardrec.trainer.job.config import ModelConfig

# Where the EmbeddingBagCollection sits inside RecModel; plans name it by this path.
EBC_PATH = "sparse_arch.embedding_bag_collection"
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}
"""train.precision -> the autocast dtype of the dense layers (None: no autocast)."""


def bf16_support_note(device_type: str) -> str | None:
    """Why bf16 autocast would run slowly on this machine, or None where it has fast bf16
    matmuls."""
    if device_type == "cuda":
        # Emulation does not count: a pre-Ampere GPU (V100, T4) makes bf16 tensors, but slowly.
        return (
            None
            if torch.cuda.is_bf16_supported(including_emulation=False)
            else 'this GPU has no native bf16 (compute capability below 8.0): train.precision = "bf16" '
            "is emulated and slow"
        )
    # AVX512-BF16 or AMX give native bf16 dot products; oneDNN emulates bf16 elsewhere (slower than
    # fp32).
    if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported():
        return None
    return (
        'this CPU has no AVX512-BF16 or AMX instructions: under train.precision = "bf16" its matmuls are '
        "emulated and likely slower than fp32"
    )


class SparseArch(nn.Module):
    """The embedding lookups: pooled embeddings in a fixed feature order."""

    def __init__(
        self, embedding_bag_collection: EmbeddingBagCollection, feature_names: list[str]
    ) -> None:
        super().__init__()
        self.embedding_bag_collection = embedding_bag_collection
        self.feature_names = list(feature_names)

    def forward(self, features: KeyedJaggedTensor) -> list[torch.Tensor]:
        pooled = self.embedding_bag_collection(features).to_dict()
        return [pooled[name] for name in self.feature_names]


class DotInteraction(nn.Module):
    """DLRM's pairwise dot products of the dense vector and every embedding (upper triangle)."""

    def __init__(self, num_sparse: int) -> None:
        super().__init__()
        rows, cols = torch.triu_indices(num_sparse + 1, num_sparse + 1, offset=1)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)

    def out_features(self, dense_dim: int) -> int:
        return dense_dim + int(self.rows.numel())

    def forward(self, dense: torch.Tensor, sparse: list[torch.Tensor]) -> torch.Tensor:
        stacked = torch.stack([dense] + sparse, dim=1)  # [B, F + 1, D]
        dots = torch.bmm(stacked, stacked.transpose(1, 2))
        return torch.cat([dense, dots[:, self.rows, self.cols]], dim=1)


class CrossInteraction(nn.Module):
    """DCNv2's low-rank cross layers over the concatenated dense vector and embeddings."""

    def __init__(self, in_features: int, num_layers: int, low_rank: int) -> None:
        super().__init__()
        self.in_features = in_features
        self.crossnet = LowRankCrossNet(
            in_features=in_features, num_layers=num_layers, low_rank=low_rank
        )

    def out_features(self, dense_dim: int) -> int:
        return self.in_features

    def forward(self, dense: torch.Tensor, sparse: list[torch.Tensor]) -> torch.Tensor:
        return self.crossnet(torch.cat([dense] + sparse, dim=1))


class RecModel(nn.Module):
    """dense MLP + embeddings -> interaction -> over MLP -> one logit per sample."""

    def __init__(
        self,
        sparse_arch: SparseArch,
        dense_arch: nn.Module,
        interaction: nn.Module,
        over_arch: nn.Module,
        autocast_dtype: torch.dtype | None = None,
        device_type: str = "cpu",
    ) -> None:
        super().__init__()
        self.sparse_arch = sparse_arch
        self.dense_arch = dense_arch
        self.interaction = interaction
        self.over_arch = over_arch
        self.autocast_dtype = autocast_dtype
        # Fixed here, not read from the input: torchrec's pipeline traces forward with fx proxies.
        self.device_type = device_type

    def _dense_precision(self) -> contextlib.AbstractContextManager[object]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def forward(
        self,
        dense_features: torch.Tensor,
        sparse_features: KeyedJaggedTensor,
        finite: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The logits; with a `finite` list, also appends whether each stage's values are finite,
        in the order of `finite_stages` (a few reductions on the device, no sync)."""
        with self._dense_precision():
            dense = self.dense_arch(dense_features)
        sparse = self.sparse_arch(
            sparse_features
        )  # outside autocast: lookups and all-to-all in fp32
        with self._dense_precision():
            interaction = self.interaction(dense, sparse)
            logits = self.over_arch(interaction).squeeze(-1)
        if finite is not None:
            finite.append(torch.isfinite(dense_features).all(dim=0))
            outputs = [dense, *sparse, interaction, logits]
            finite.append(torch.stack([torch.isfinite(t).all() for t in outputs]))
        return logits.float()  # the loss and the metrics in fp32 (a no-op under fp32)


def finite_stages(dense_names: list[str], feature_names: list[str]) -> list[str]:
    """What each of RecModel.forward's `finite` flags is about, in forward order: each dense
    input, the dense layers, each feature's pooled embeddings, the interaction, the over arch."""
    return [
        *(f"the dense input {n}" for n in dense_names),
        "the dense layers (dense_arch)",
        *(f"the embeddings of {f} (its table's weights)" for f in feature_names),
        "the interaction",
        "the over arch (over_arch)",
    ]


def _mlp(in_size: int, sizes: list[int], device: torch.device) -> nn.Module:
    if not sizes:
        return nn.Identity()
    return MLP(in_size, sizes, bias=True, activation=torch.relu, device=device)


def _over_arch(in_size: int, sizes: list[int], device: torch.device) -> nn.Module:
    # The last layer is a plain linear map to the logit: no ReLU after it.
    hidden = _mlp(in_size, sizes[:-1], device)
    last_in = sizes[-2] if len(sizes) > 1 else in_size
    return nn.Sequential(hidden, nn.Linear(last_in, sizes[-1], device=device))


def build_model(
    model_config: ModelConfig,
    ebc: EmbeddingBagCollection,
    feature_names: list[str],
    num_dense: int,
    *,
    dense_device: str | torch.device = "cpu",
    precision: str = "fp32",
) -> RecModel:
    """A DLRM or DCNv2 over `ebc` (usually on the meta device, to be sharded).

    The dense layers draw their initial weights from torch's global RNG: seed it first so every
    rank, plan and world size starts from the same dense weights.

    Args:
        model_config: the architecture (arch, dense_arch, over_arch, dcn_layers, dcn_low_rank);
            embedding widths are read from `ebc`'s tables.
        ebc: the embedding tables.
        feature_names: the sparse features, in the order the interaction reads them.
        num_dense: number of dense features.
        dense_device: where the dense layers live.
        precision: a key of PRECISIONS (train.precision).
    """
    device = torch.device(dense_device)
    dims = {name: None for name in feature_names}
    for table in ebc.embedding_bag_configs():
        for name in table.feature_names:
            dims[name] = table.embedding_dim
    missing = [n for n, d in dims.items() if d is None]
    if missing:
        raise ValueError(f"no embedding table serves feature(s) {', '.join(missing)}")
    arch, dense_arch = model_config.arch, model_config.dense_arch
    dense_dim = dense_arch[-1] if dense_arch else num_dense
    if arch == "dlrm":
        wrong = sorted({d for d in dims.values()} - {dense_dim})
        if wrong:
            raise ValueError(
                f"DLRM needs every embedding width equal to the dense output {dense_dim}, found {wrong}"
            )
        interaction: nn.Module = DotInteraction(len(feature_names))
        interaction.to(device)
    elif arch == "dcnv2":
        width = dense_dim + sum(dims.values())  # type: ignore[arg-type]
        interaction = CrossInteraction(
            width, model_config.dcn_layers, model_config.dcn_low_rank
        ).to(device)
    else:
        raise ValueError(f"model.arch = {arch!r} is not one of dlrm, dcnv2")
    return RecModel(
        SparseArch(ebc, feature_names),
        _mlp(num_dense, dense_arch, device),
        interaction,
        _over_arch(interaction.out_features(dense_dim), model_config.over_arch, device),
        autocast_dtype=PRECISIONS[precision],
        device_type=device.type,
    )
