"""The models: DLRM (dot interaction) and DCNv2 (the DLRMv2 model) over one EmbeddingBagCollection.

Both read the pooled embeddings by feature name: a sharded EmbeddingBagCollection returns its
KeyedTensor keys in an order that depends on the plan, so position means nothing.

Precision (train.precision): under bf16 the dense layers and the interaction run in
torch.autocast (bf16 matmuls, fp32 weights); the embedding lookups and their all-to-all stay
outside it, and the logit is returned in fp32 so that the loss and metrics are fp32.

Compilation (train.compile): the same two dense parts (the dense MLP; the interaction with the over
MLP) may run torch.compile'd in training; the embeddings and their all-to-all always run eagerly,
through torchrec.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import warnings

import torch
import torch.nn as nn
from torchrec.modules.crossnet import LowRankCrossNet
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.modules.mlp import MLP
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shardrec.trainer.job.model_section import ModelConfig
from shardrec.trainer.job.precision import PRECISIONS

# Where the EmbeddingBagCollection sits inside RecModel; plans name it by this path.
EBC_PATH = "sparse_arch.embedding_bag_collection"
# Where a sequence model's EmbeddingCollection sits (HSTUModel's SequenceSparseArch).
EC_PATH = "sparse_arch.embedding_collection"
COMPILE_MIN_DENSE_PARAMS = 1_000_000
"""train.compile = auto compiles dense layers of at least this many parameters (CPU): below it
the compile (~1 min) is not paid back by runs of usual length."""


def cpp_compiler() -> str | None:
    """The C++ compiler inductor would use on CPU (its CXX, else g++ / c++ / clang++), if any."""
    for name in filter(None, (os.environ.get("CXX"), "g++", "c++", "clang++")):
        if shutil.which(name):
            return name
    return None


def resolve_compile(setting: str, device_type: str, dense_params: int) -> bool:
    """train.compile on this machine: `auto` compiles CPU training of dense layers of at least
    COMPILE_MIN_DENSE_PARAMS parameters where a C++ compiler is present (CUDA: not yet tested)."""
    if setting != "auto":
        return setting == "on"
    return (
        device_type == "cpu"
        and dense_params >= COMPILE_MIN_DENSE_PARAMS
        and cpp_compiler() is not None
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


class PairwiseDots(torch.autograd.Function):
    """The upper triangle of X X^T per sample, X = [B, F, D] the F rows (each [B, D]) stacked, as
    [B, F(F-1)/2]: autograd's own arithmetic on torch.stack's X, bit for bit, with less work
    around it.

    Autograd's backward of bmm(X, X^T)[:, rows, cols] scatters the gradient with an accumulating
    index_put, runs one bmm per operand and adds the two through a transposed layout in its input
    buffer. Here the triangle is read and written through flat positions (index_select /
    index_copy_ on [B, F*F], 6x and 2x faster than advanced indexing on [B, F, F]) and the two
    bmms, the same calls autograd makes, are summed in place: forward and backward of a
    1024-sample reference-model step took 7.7-8.3 ms against 8.1-9.8 ms on one loaded CPU thread
    (fastest of 40), the same bits. One bmm of (G + G^T) X would take half the backward but
    rounds differently: the demo's test AUC moved from 0.8764 to 0.8763.
    """

    @staticmethod
    def forward(ctx: object, upper: torch.Tensor, *rows: torch.Tensor) -> torch.Tensor:
        """`rows`: X's F rows, each [B, D] (the dense vector, then the embeddings)."""
        # X is stacked in the dtype bmm computes in (bf16 under bf16 autocast, which would cast
        # the stack's fp32 X in bmm: the same bits) and only that X is kept: a compiled bf16
        # step writes one bf16 X, where stacking in fp32 wrote an fp32 X and two bf16 copies.
        device = rows[0].device.type
        low = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        x = torch.stack([r.to(low) for r in rows] if low else list(rows), dim=1)
        ctx.save_for_backward(x, upper)  # type: ignore[attr-defined]
        ctx.dtypes = [r.dtype for r in rows]  # type: ignore[attr-defined]
        batch, width = x.shape[0], x.shape[1]
        dots = torch.bmm(x, x.transpose(1, 2))
        return dots.reshape(batch, width * width).index_select(1, upper)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, upper = ctx.saved_tensors  # type: ignore[attr-defined]
        dtypes: list[torch.dtype] = ctx.dtypes  # type: ignore[attr-defined]
        batch, width = x.shape[0], x.shape[1]
        full = grad.new_zeros(batch, width * width)
        full.index_copy_(1, upper, grad.contiguous())  # each position once: nothing to add up
        full = full.view(batch, width, width)
        # Under bf16 autocast the forward bmm ran on two bf16 copies of X, so autograd's two
        # products are bf16, each made fp32 (the stack's dtype: the widest row's) on its own
        # before the sum; in fp32 .to() is a no-op. Each row's gradient then takes its row's
        # dtype, as the stack's backward would give it.
        wide = functools.reduce(torch.promote_types, dtypes)
        x = x.to(grad.dtype)
        dx = torch.bmm(full, x).to(wide)
        dx += torch.bmm(x.transpose(1, 2), full).transpose(1, 2).to(wide)
        return None, *(d.to(dtype) for d, dtype in zip(dx.unbind(1), dtypes))


class DotInteraction(nn.Module):
    """DLRM's pairwise dot products of the dense vector and every embedding (upper triangle)."""

    def __init__(self, num_sparse: int) -> None:
        super().__init__()
        width = num_sparse + 1
        rows, cols = torch.triu_indices(width, width, offset=1)
        # Flat positions of the upper triangle in a [width, width] matrix.
        self.register_buffer("upper", rows * width + cols, persistent=False)

    def out_features(self, dense_dim: int) -> int:
        return dense_dim + int(self.upper.numel())

    def forward(self, dense: torch.Tensor, sparse: list[torch.Tensor]) -> torch.Tensor:
        dots = PairwiseDots.apply(self.upper, dense, *sparse)
        return torch.cat([dense, dots], dim=1)


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
        # torch.compile'd dense parts (compile_dense), used in training only: evaluation runs the
        # same modules eagerly (other batch sizes, no autograd: no second compile to wait for).
        self._compiled: tuple[object, object] | None = None

    def compile_dense(self, fall_back: bool = False) -> None:
        """Compile the dense MLP, and the interaction with the over MLP, for training. The modules
        and their parameters stay where they are (state-dict names, DDP, checkpoints unchanged):
        the compiled callables read them. `fall_back`: where compiling fails (a broken C++
        toolchain), run those parts eagerly instead of failing the step (train.compile = auto)."""
        if fall_back:
            # torch's one switch for it is process-wide; the rank compiles nothing else.
            torch._dynamo.config.suppress_errors = True
        if self.device_type == "cpu":
            # Process-wide too. DDP's graph splitting (one compiled graph per gradient bucket, so
            # that a bucket's all-reduce overlaps the rest of the backward) cuts the over MLP at
            # its first bucket (1 MB of parameters). A ReLU whose output leaves a graph then
            # saves a bool mask for the backward, and inductor's C++ code stores bool masks
            # element by element: on the reference model that one [1024, 1024] mask took 7.3 ms
            # a step in fp32 (3.0 in bf16), where eager computes it in 0.6. The all-reduce it
            # would overlap takes ~0.2 ms a step on CPU ranks (bench train --breakdown).
            torch._dynamo.config.optimize_ddp = False
        self._compiled = (torch.compile(self._dense), torch.compile(self._head))

    @property
    def compiled(self) -> bool:
        return self._compiled is not None

    def _dense(self, dense_features: torch.Tensor) -> torch.Tensor:
        with self._dense_precision():
            return self.dense_arch(dense_features)

    def _head(
        self, dense: torch.Tensor, sparse: list[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The interaction's output (for the finite flags) and the logits."""
        with self._dense_precision():
            interaction = self.interaction(dense, sparse)
            logits = self.over_arch(interaction).squeeze(-1)
        return interaction, logits.float()  # the loss and the metrics in fp32 (no-op in fp32)

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
        dense_fn, head_fn = (
            self._compiled
            if self._compiled is not None and self.training
            else (self._dense, self._head)
        )
        dense = dense_fn(dense_features)  # type: ignore[operator]
        # Outside autocast and compile: lookups and all-to-all in fp32, through torchrec.
        sparse = self.sparse_arch(sparse_features)
        interaction, logits = head_fn(dense, sparse)  # type: ignore[operator]
        if finite is not None:
            finite.append(all_finite(dense_features, dim=0))
            outputs = [dense, *sparse, interaction, logits]
            finite.append(torch.stack([all_finite(t) for t in outputs]))
        return logits


def all_finite(values: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """`torch.isfinite(values).all(dim)` in one pass and no temporaries: the minimum and maximum
    are both finite exactly when every value is (a NaN makes both NaN, an inf one of them inf).
    The step's finite flags over ~30 outputs took ~4.8 ms a step through isfinite, 0.4 this way."""
    if values.numel() == 0:
        return torch.isfinite(values).all() if dim is None else torch.isfinite(values).all(dim=dim)
    low, high = torch.aminmax(values) if dim is None else torch.aminmax(values, dim=dim)
    return torch.isfinite(low) & torch.isfinite(high)


# A leaf of torch.fx graphs: torchrec's train pipeline traces the model, and the empty check above
# is control flow that a trace cannot follow.
torch.fx.wrap("all_finite")


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
    with warnings.catch_warnings():
        # A spec of no dense columns: the first layer reads nothing and learns its bias alone,
        # which torch's initializer warns of on every rank and in every eval and predict.
        warnings.filterwarnings("ignore", message="Initializing zero-element tensors is a no-op")
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
    compile_dense: bool = False,
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
        precision: a key of PRECISIONS (train.precision, resolved).
        compile_dense: torch.compile the dense parts for training (train.compile, resolved).
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
    model = RecModel(
        SparseArch(ebc, feature_names),
        _mlp(num_dense, dense_arch, device),
        interaction,
        _over_arch(interaction.out_features(dense_dim), model_config.over_arch, device),
        autocast_dtype=PRECISIONS[precision],
        device_type=device.type,
    )
    if compile_dense:
        model.compile_dense()
    return model


def dense_parameters(model: RecModel) -> int:
    """Parameters of the dense layers and the interaction (what train.compile = auto weighs)."""
    parts = (model.dense_arch, model.interaction, model.over_arch)
    return sum(p.numel() for part in parts for p in part.parameters())
