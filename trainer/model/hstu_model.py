"""The HSTU ranking model (DLRMv4's DlrmHSTU, in plain PyTorch): a user's history as a sequence of
tokens, read causally by STU layers, scored against a candidate.

Per sample the sequence is K contextual tokens (each pooled bag feature projected to the token
width, and the dense features as one more), then the history (most recent last; at most
`hstu_max_seq_len` - K - 1 kept), then the candidate. A history token is the sum of three small
MLPs (Linear, SwishLN, Linear, LayerNorm) over its primary id's embedding, its side ids'
embeddings (concatenated) and its action bits (a learnt vector per set bit); the candidate's is
the same with its own ids and a learnt action vector of its own (its label is never an input).
The tokens get sqrt(D) times their content plus a position and a time-since embedding
(`hstu_bias` "input"), and/or a relative bias inside each attention ("pairwise"). The
candidate's last hidden state, with the hour of day and day of week of its time, is the user
vector; an MLP of the candidate's embeddings is the item vector; their product goes through a
SwishLN MLP to the logit.

Which feature is what comes from the dataset's manifest (shardrec.dataloader.format.manifest
SparseFeature): the one sequence without `side_of` is the primary, sequences with `side_of` are
its sides (ids with a table, `timestamps`, `integers` as action bits), a non-sequence feature that
reads a sequence's table is the candidate's, and every other id feature is a contextual bag.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.autograd.profiler import record_function
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from shardrec.dataloader.format.manifest import SparseFeature
from shardrec.embeddings.tables import build_ebc, build_ec, is_unpooled
from shardrec.trainer.job.model_section import ModelConfig
from shardrec.trainer.model.hstu import (
    PositionTimeEncoder,
    RelativeBias,
    STULayer,
    attention_weights_mask,
)
from shardrec.trainer.model.models import all_finite
from shardrec.trainer.model.sequence_arch import Jagged, SequenceSparseArch

torch.fx.wrap("all_finite")  # models.all_finite: a leaf of traced graphs here too

LOOKUPS_SCOPE = "shardrec.hstu.lookups"
"""The profiler range of the embedding lookups, their all-to-alls included."""
OUT_LN_EPS = 1e-5
"""The layer-norm epsilon of the MLPs around the STU layers (the reference's)."""
TWO_PI = 2 * 3.14
"""The reference's hour and weekday angles use 3.14 for pi: kept, so weights carry over."""


@dataclass(frozen=True)
class SequenceRoles:
    """Which feature of a dataset plays which part in the sequence (module docstring)."""

    primary: str
    sides: tuple[str, ...]
    """Side sequences of ids, in manifest order."""
    candidates: dict[str, str]
    """Sequence feature -> the candidate's feature on the same table."""
    contextual: tuple[str, ...]
    timestamps: str = ""
    actions: str = ""

    @classmethod
    def of(cls, features: list[SparseFeature], tables: list[EmbeddingBagConfig]) -> SequenceRoles:
        """The roles, from the manifest's features and the model's tables; ValueError (one line)
        when the dataset cannot make HSTU's sequence."""
        by_name = {f.name: f for f in features}
        primaries = [f.name for f in features if f.sequence and not f.side_of]
        if len(primaries) != 1:
            raise ValueError(
                'model.arch = "hstu" needs one primary sequence feature (a sequence without '
                f"side_of), the dataset has {len(primaries)}: {', '.join(primaries) or 'none'}"
            )
        primary = primaries[0]
        sides = [f for f in features if f.sequence and f.side_of]
        wrong = [f.name for f in sides if f.side_of != primary]
        if wrong:
            raise ValueError(f"side sequences {', '.join(wrong)} are not sides of {primary}")
        raw = {v: [f.name for f in sides if f.values == v] for v in ("timestamps", "integers")}
        for kind, names in raw.items():
            if len(names) > 1:
                raise ValueError(
                    f"HSTU reads one side sequence of {kind}, the dataset has {', '.join(names)}"
                )
        candidates: dict[str, str] = {}
        contextual = []
        for table in tables:
            sequence = [n for n in table.feature_names if by_name[n].sequence]
            others = [n for n in table.feature_names if not by_name[n].sequence]
            if not is_unpooled(table):
                contextual += list(table.feature_names)
                continue
            if len(sequence) != 1 or len(others) > 1:
                raise ValueError(
                    f"table {table.name}: HSTU needs one sequence and at most one candidate "
                    f"feature on it, found {', '.join(table.feature_names)}"
                )
            if others:
                candidates[sequence[0]] = others[0]
        if primary not in candidates:
            raise ValueError(
                f"HSTU scores a candidate: the dataset has no feature that reads the table of "
                f"{primary} (a non-sequence feature with table = the sequence's)"
            )
        return cls(
            primary=primary,
            sides=tuple(f.name for f in sides if f.values == "ids"),
            candidates=candidates,
            contextual=tuple(contextual),
            timestamps=(raw["timestamps"] or [""])[0],
            actions=(raw["integers"] or [""])[0],
        )


class SwishLayerNorm(nn.Module):
    """x * sigmoid(LayerNorm(x))."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=OUT_LN_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.norm(x))


def _content_mlp(in_dim: int, hidden: int, dim: int) -> nn.Sequential:
    mlp = nn.Sequential(
        nn.Linear(in_dim, hidden),
        SwishLayerNorm(hidden),
        nn.Linear(hidden, dim),
        nn.LayerNorm(dim, eps=OUT_LN_EPS),
    )
    for layer in (mlp[0], mlp[2]):
        nn.init.xavier_normal_(layer.weight)
        nn.init.zeros_(layer.bias)
    return mlp


def _xavier_linear(in_dim: int, out_dim: int) -> nn.Linear:
    layer = nn.Linear(in_dim, out_dim)
    nn.init.xavier_uniform_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


def _xavier_normal(in_dim: int, out_dim: int) -> nn.Linear:
    layer = nn.Linear(in_dim, out_dim)
    nn.init.xavier_normal_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


def keep_recent(jagged: Jagged, keep: torch.Tensor) -> Jagged:
    """Each row's last `keep` values (all of a shorter row)."""
    lengths = jagged.lengths
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    row = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
    position = torch.arange(row.numel(), device=lengths.device) - offsets[row]
    kept = position >= (lengths - keep).clamp(min=0)[row]
    return Jagged(jagged.values[kept], torch.minimum(lengths, keep))


class HSTUModel(nn.Module):
    """Lookups, the sequence's tokens, the STU layers and the head: `forward(dense, features)` ->
    one logit per sample."""

    def __init__(
        self,
        sparse_arch: SequenceSparseArch,
        roles: SequenceRoles,
        config: ModelConfig,
        bag_dims: dict[str, int],
        dim: int,
        num_dense: int,
    ) -> None:
        super().__init__()
        self.sparse_arch, self.roles, self.dim = sparse_arch, roles, dim
        self.max_seq_len = config.hstu_max_seq_len
        self.by_batch = config.hstu_attn_scale == "batch_max"
        self.context = nn.ModuleList(_xavier_normal(bag_dims[n], dim) for n in roles.contextual)
        self.dense = _xavier_normal(num_dense, dim) if num_dense else None
        self.num_context = len(roles.contextual) + (1 if num_dense else 0)
        if self.max_seq_len < self.num_context + 2:
            raise ValueError(
                f"model.hstu_max_seq_len = {self.max_seq_len} leaves no room for a history after "
                f"{self.num_context} contextual tokens and the candidate"
            )
        hidden = config.hstu_hidden
        self.item_content = _content_mlp(dim, hidden, dim)
        self.side_content = (
            _content_mlp(dim * len(roles.sides), hidden, dim) if roles.sides else None
        )
        bits, width = config.hstu_action_bits, config.hstu_action_dim
        self.action_bits = bits if roles.actions else 0
        if self.action_bits:
            self.action_vectors = nn.Parameter(torch.empty(bits, width).normal_(0, 0.1))
            self.candidate_action = nn.Parameter(torch.empty(bits * width).normal_(0, 0.1))
            self.action_content = _content_mlp(bits * width, hidden, dim)
        self.encoder = (
            PositionTimeEncoder(
                dim, self.max_seq_len, config.hstu_time_buckets + 1, config.hstu_input_dropout
            )
            if config.hstu_bias in ("input", "both")
            else None
        )
        self.layers = nn.ModuleList(
            STULayer(
                dim, config.hstu_heads, config.hstu_qk_dim, config.hstu_v_dim, config.hstu_dropout
            )
            for _ in range(config.hstu_layers)
        )
        self.biases = (
            nn.ModuleList(
                RelativeBias(self.max_seq_len, recency=config.hstu_recency)
                for _ in range(config.hstu_layers)
            )
            if config.hstu_bias in ("pairwise", "both")
            else None
        )
        self.user_out = nn.Sequential(
            _xavier_normal(dim + 4, dim), nn.LayerNorm(dim, eps=OUT_LN_EPS)
        )
        item_in = dim * (1 + sum(1 for s in roles.sides if s in roles.candidates))
        self.item_tower = nn.Sequential(
            _xavier_linear(item_in, dim),
            SwishLayerNorm(dim),
            _xavier_linear(dim, dim),
            nn.LayerNorm(dim, eps=OUT_LN_EPS),
        )
        self.head = nn.Sequential(
            _xavier_linear(dim, dim), SwishLayerNorm(dim), _xavier_linear(dim, 1)
        )

    def activation_bytes_per_sample(self) -> int:
        """What one sample's layers keep for backward at the full length N (the planner's memory
        estimate): per layer the scores, their SiLU and the masked weights (3 H N^2), and per
        token the projections, the attention output and the layer's input (fp32)."""
        n, total = self.max_seq_len, 0
        for layer in self.layers:
            h, dqk, dv = layer.heads, layer.qk_dim, layer.v_dim
            per_token = h * (2 * dv + 2 * dqk) + 3 * h * dv + 2 * self.dim
            total += 4 * (3 * h * n * n + n * per_token)
        return total

    def _bits(self, actions: torch.Tensor) -> torch.Tensor:
        """[N] action masks -> [N, bits * width]: bit b's vector where it is set, else zeros."""
        shifts = torch.arange(self.action_bits, device=actions.device)
        on = ((actions.view(-1, 1) >> shifts) & 1).to(self.action_vectors.dtype)
        return (on.unsqueeze(2) * self.action_vectors).flatten(1)

    def _content(self, primary, sides, actions):
        """Token content: the sum of the item, side and action MLPs."""
        out = self.item_content(primary)
        if self.side_content is not None:
            out = out + self.side_content(torch.cat(sides, dim=1))
        if self.action_bits:
            out = out + self.action_content(actions)
        return out

    def embedded_features(self) -> list[str]:
        """The features whose embeddings forward reads, in the order of its `finite` flags."""
        r = self.roles
        return [*r.contextual, r.primary, *r.sides, *r.candidates.values()]

    def finite_stages(self, dense_names: list[str]) -> list[str]:
        """What each of forward's `finite` flags is about, in forward order: each dense input,
        each feature's embeddings, each STU layer, the head."""
        return [
            *(f"the dense input {n}" for n in dense_names),
            *(f"the embeddings of {f} (its table's weights)" for f in self.embedded_features()),
            *(f"STU layer {i}" for i in range(len(self.layers))),
            "the head (user and item towers)",
        ]

    def forward(
        self,
        dense_features: torch.Tensor,
        sparse_features: KeyedJaggedTensor,
        finite: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The logits; with a `finite` list, also appends whether each stage's values are finite,
        in the order of `finite_stages` (a few reductions, no sync)."""
        roles, dim = self.roles, self.dim
        with record_function(LOOKUPS_SCOPE):
            pooled, unpooled = self.sparse_arch(sparse_features)
        raw = sparse_features.to_dict()
        batch, device = dense_features.shape[0], dense_features.device
        keep = torch.full((batch,), self.max_seq_len - self.num_context - 1, device=device)
        history = {n: keep_recent(unpooled[n], keep) for n in (roles.primary, *roles.sides)}
        lengths = history[roles.primary].lengths
        sequence_raw = {
            n: keep_recent(Jagged(raw[n].values(), raw[n].lengths()), keep).values
            for n in (roles.timestamps, roles.actions)
            if n
        }
        # History and candidate tokens.
        hist_actions = self._bits(sequence_raw[roles.actions]) if self.action_bits else None
        hist = self._content(
            history[roles.primary].values, [history[s].values for s in roles.sides], hist_actions
        )
        cand_ids = {n: unpooled[roles.candidates[n]].values for n in roles.candidates}
        cand_sides = [
            cand_ids[s] if s in cand_ids else hist.new_zeros(batch, dim) for s in roles.sides
        ]
        cand_actions = self.candidate_action.expand(batch, -1) if self.action_bits else None
        cand = self._content(cand_ids[roles.primary], cand_sides, cand_actions)
        context = [proj(pooled[n]) for proj, n in zip(self.context, roles.contextual)]
        if self.dense is not None:
            context.append(self.dense(dense_features))
        # One jagged sequence per sample: K contextual tokens, the history, the candidate.
        k = self.num_context
        seq_lengths = lengths + k + 1
        offsets = torch.cat([seq_lengths.new_zeros(1), seq_lengths.cumsum(0)])
        tokens = hist.new_zeros(int(offsets[-1]), dim)
        starts = offsets[:-1]
        for i, token in enumerate(context):
            tokens[starts + i] = token
        row = torch.repeat_interleave(torch.arange(batch, device=device), lengths)
        hist_offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        at = starts[row] + k + torch.arange(row.numel(), device=device) - hist_offsets[row]
        tokens[at] = hist
        tokens[offsets[1:] - 1] = cand
        times = torch.zeros(int(offsets[-1]), dtype=torch.long, device=device)
        query_time = torch.zeros(batch, dtype=torch.long, device=device)
        if roles.timestamps:
            hist_times = sequence_raw[roles.timestamps].long()
            times[at] = hist_times
            has = lengths > 0
            query_time[has] = hist_times[hist_offsets[1:][has] - 1]
            times[offsets[1:] - 1] = query_time  # the candidate at its history's last time
        targets = torch.ones(batch, dtype=torch.long, device=device)
        x = tokens
        if self.encoder is not None:
            x = self.encoder(tokens, times, offsets, targets, k)
        attn_len = None if self.by_batch else self.max_seq_len
        n = int(seq_lengths.max()) if batch else 0
        mask = attention_weights_mask(seq_lengths, n, attn_len, targets)  # one for every layer
        states = []
        pairs = self.biases[0].indices(times, offsets) if self.biases is not None else None
        for i, layer in enumerate(self.layers):
            bias = self.biases[i](pairs) if self.biases is not None else None
            x = layer(x, offsets, attn_len=attn_len, targets=targets, bias=bias, weights_mask=mask)
            states.append(x)
        # The candidate's last state with its time of day and week, against the candidate's item.
        hour = TWO_PI * torch.remainder(torch.div(query_time, 3600, rounding_mode="floor"), 24) / 24
        day = TWO_PI * torch.remainder(torch.div(query_time, 86400, rounding_mode="floor"), 7) / 7
        angles = torch.stack([hour.cos(), hour.sin(), day.cos(), day.sin()], dim=1).to(x.dtype)
        user = self.user_out(torch.cat([x[offsets[1:] - 1], angles], dim=1))
        item_in = [cand_ids[roles.primary], *(cand_ids[s] for s in roles.sides if s in cand_ids)]
        item = self.item_tower(torch.cat(item_in, dim=1))
        logits = self.head(user * item).squeeze(-1)
        if finite is not None:
            finite.append(all_finite(dense_features, dim=0))
            looked_up = [
                *(pooled[n] for n in roles.contextual),
                history[roles.primary].values,
                *(history[s].values for s in roles.sides),
                *(unpooled[c].values for c in roles.candidates.values()),
            ]
            outputs = [*looked_up, *states, logits]
            finite.append(torch.stack([all_finite(t) for t in outputs]))
        return logits


def build_hstu_model(
    config: ModelConfig,
    tables: list[EmbeddingBagConfig],
    features: list[SparseFeature],
    num_dense: int,
    *,
    dedup: bool = False,
    device: str | torch.device = "meta",
) -> HSTUModel:
    """HSTU over `tables` (bags pooled, a sequence's tables unpooled: build_table_configs with
    unpooled_sequences), the embeddings on `device` (meta: to be sharded), the rest on the CPU.
    Seed torch's global RNG first: the dense weights are drawn from it."""
    bags = [t for t in tables if not is_unpooled(t)]
    sequences = [t for t in tables if is_unpooled(t)]
    roles = SequenceRoles.of(features, tables)
    widths = sorted({t.embedding_dim for t in sequences})
    if len(widths) != 1:
        raise ValueError(
            f"HSTU's sequence tables need one width (model.embedding_dim), found {widths}"
        )
    arch = SequenceSparseArch(
        build_ebc(bags, device) if bags else None, build_ec(sequences, device), dedup=dedup
    )
    bag_dims = {n: t.embedding_dim for t in bags for n in t.feature_names}
    return HSTUModel(arch, roles, config, bag_dims, widths[0], num_dense)
