"""HSTU's sequence layers in plain PyTorch, fp32: jagged sequences, pointwise SiLU attention,
relative position and time, the STU layer (Zhai et al. 2024, "Actions Speak Louder than Words").

Sequences are jagged: the tokens of a batch back to back ([L, D]) with per-sequence offsets.
Attention pads them to the batch's longest sequence n ([B, H, n, n] scores), which bounds memory
by B·H·n² per layer; that is why sequence models here keep n in the hundreds on CPU (GPU kernels
that never materialise the scores are what make the reference's 4,096 trainable).

The attention of token i over token j of one sequence, per head (no softmax):

    A_ij = SiLU(alpha * q_i . k_j + bias_ij) / N * valid(i, j),    o_i = sum_j A_ij v_j

N is a fixed length (`attn_len`; the reference divides by the largest sequence of the rank's
batch, which ties a sample's score to its neighbours: `scale_by_batch` does that). valid(i, j) is
causal over a causal index c: c_i = i, except that the last `targets` tokens of a sequence (its
candidates) share the index of the first of them, so that they see the history and themselves but
not each other; with `max_attn_len` M a token sees only the M indices before its own; with a
contextual prefix of K tokens, the prefix sees the whole history. The relative bias (optional)
is a learnt value per distance j - i plus one per bucket of the time gap, shared by heads.

Every function here was written from those equations; tests/unit/test_hstu.py checks them
against masks built element by element and against values computed with the reference's own
PyTorch attention (pytorch_hstu_mha of meta-recsys/generative-recommenders, run outside this
repository, never copied).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.profiler import record_function

LN_EPS = 1e-6
"""The STU layer's layer-norm epsilon (the reference's)."""
ATTENTION_SCOPE = "shardrec.hstu.attention"
"""The profiler range of an STU layer's attention (`shardrec bench train --model hstu` reads the
share of time spent in it)."""


def jagged_index(offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence, position) of every token of a jagged batch."""
    lengths = offsets[1:] - offsets[:-1]
    sequence = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=offsets.device), lengths
    )
    return sequence, torch.arange(sequence.numel(), device=offsets.device) - offsets[sequence]


def to_padded(values: torch.Tensor, offsets: torch.Tensor, n: int) -> torch.Tensor:
    """[L, ...] jagged -> [B, n, ...], zeros past each sequence's end (n >= every length)."""
    sequence, position = jagged_index(offsets)
    out = values.new_zeros((offsets.numel() - 1, n, *values.shape[1:]))
    return out.index_put((sequence, position), values)


def from_padded(padded: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """[B, n, ...] -> [L, ...]: each sequence's first length rows."""
    sequence, position = jagged_index(offsets)
    return padded[sequence, position]


def causal_index(
    lengths: torch.Tensor, n: int, targets: torch.Tensor | None, contextual: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The causal index c [B, n] of each padded position, and the index past the history [B]."""
    c = torch.arange(n, device=lengths.device).expand(lengths.numel(), n)
    end = lengths.clone()
    if contextual > 0:
        c = (c - (contextual - 1)).clamp(min=0)
        end = end - (contextual - 1)
    if targets is not None:
        end = end - targets
        c = torch.minimum(c, end.view(-1, 1))
    return c, end


def attention_mask(
    lengths: torch.Tensor,
    n: int,
    targets: torch.Tensor | None = None,
    contextual: int = 0,
    max_attn_len: int = 0,
) -> torch.Tensor:
    """valid [B, n, n]: whether query i may read key j (module docstring)."""
    c, end = causal_index(lengths, n, targets, contextual)
    ahead = c.unsqueeze(2) - c.unsqueeze(1)  # c_i - c_j
    valid = (ahead > 0) | torch.eye(n, dtype=torch.bool, device=lengths.device)
    if max_attn_len > 0:
        valid = valid & (ahead <= max_attn_len)
    if contextual > 0:
        prefix = (c == 0).unsqueeze(2) & (c.unsqueeze(1) < end.view(-1, 1, 1))
        valid = valid | prefix
    return valid


def attention_weights_mask(
    lengths: torch.Tensor,
    n: int,
    attn_len: int | None,
    targets: torch.Tensor | None = None,
    contextual: int = 0,
    max_attn_len: int = 0,
) -> torch.Tensor:
    """[B, 1, n, n] float: 1/N where query i may read key j, 0 elsewhere (the mask and the divisor
    in one factor; a model computes it once per batch for all its layers)."""
    valid = attention_mask(lengths, n, targets, contextual, max_attn_len)
    return (valid.to(torch.float32) / float(attn_len or max(n, 1))).unsqueeze(1)


def hstu_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    offsets: torch.Tensor,
    *,
    alpha: float,
    attn_len: int | None,
    targets: torch.Tensor | None = None,
    contextual: int = 0,
    max_attn_len: int = 0,
    bias: torch.Tensor | None = None,
    weights_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pointwise attention over jagged sequences.

    Args:
        q, k: [L, H, d_qk]; v: [L, H, d_v], jagged by `offsets` [B + 1].
        alpha: the scale of q.k (d_qk ** -0.5).
        attn_len: N, the divisor of the scores (>= every length); None: the batch's longest.
        targets: [B] candidates at the end of each sequence (None: plain causal).
        bias: [B, n, n] added to the scores before SiLU, n the batch's longest (None: no bias).
        weights_mask: attention_weights_mask of these sequences, if already made (the mask
            arguments are then not read).
    Returns:
        [L, H, d_v].
    """
    lengths = offsets[1:] - offsets[:-1]
    n = int(lengths.max()) if lengths.numel() else 0
    if attn_len is not None and n > attn_len:
        raise ValueError(f"a sequence of {n} tokens is longer than the attention's {attn_len}")
    # Padded to the batch's longest only: masked positions add nothing, the divisor stays N.
    qp, kp, vp = (to_padded(t, offsets, n).transpose(1, 2) for t in (q, k, v))  # [B, H, n, d]
    scores = torch.matmul(qp, kp.transpose(2, 3)) * alpha
    if bias is not None:
        scores = scores + bias.unsqueeze(1)
    if weights_mask is None:
        weights_mask = attention_weights_mask(
            lengths, n, attn_len, targets, contextual, max_attn_len
        )
    weights = F.silu(scores) * weights_mask
    return from_padded(torch.matmul(weights, vp).transpose(1, 2), offsets)


def time_gap_bucket(gap: torch.Tensor, buckets: int) -> torch.Tensor:
    """Log buckets of a time gap in seconds: floor(ln(max(|gap|, 1)) / 0.301), at most `buckets`."""
    return (torch.log(gap.abs().clamp(min=1).float()) / 0.301).floor().long().clamp(0, buckets)


class RelativeBias(nn.Module):
    """The research model's relative attention bias, shared by heads: w_pos[j - i] + w_time[bucket
    of t_(i+1) - t_j] (the next token's time, the last token's own), over a fixed length. Both
    start N(0, 0.02); with a `recency` slope, w_pos of a token d places back starts d x slope lower
    too (a linear recency prior, as ALiBi's)."""

    def __init__(self, max_len: int, time_buckets: int = 128, recency: float = 0.0) -> None:
        super().__init__()
        self.max_len, self.time_buckets = max_len, time_buckets
        self.position = nn.Parameter(torch.empty(2 * max_len - 1).normal_(0, 0.02))
        self.time = nn.Parameter(torch.empty(time_buckets + 1).normal_(0, 0.02))
        if recency:
            # w_pos[max_len - 1 - d] is the bias of a key d places back (rel in indices).
            back = torch.arange(max_len - 1, -1, -1, dtype=torch.float32)
            with torch.no_grad():
                self.position[:max_len] -= recency * back

    def indices(
        self, timestamps: torch.Tensor, offsets: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The row of w_pos [n, n] and of w_time [B, n, n] of every (query, key) pair of a batch,
        from the tokens' timestamps [L] (seconds): the same for every layer, so a model makes
        them once per batch."""
        lengths = offsets[1:] - offsets[:-1]
        n = int(lengths.max()) if lengths.numel() else 0
        if n > self.max_len:
            raise ValueError(f"a sequence of {n} tokens is longer than the bias's {self.max_len}")
        t = to_padded(timestamps, offsets, n)  # [B, n]
        end = (lengths - 1).clamp(min=0).view(-1, 1)
        ahead = torch.arange(n, device=t.device)
        # The next token's time; the last token's own at each sequence's end, not the padding
        # after it (which would make a sample's bias depend on the longest sequence of its batch).
        following = torch.where(
            ahead.view(1, n) == end, t.gather(1, end), torch.cat([t[:, 1:], t[:, -1:]], dim=1)
        )
        rel = self.max_len - 1 + ahead.view(1, n) - ahead.view(n, 1)  # [i, j] -> j - i
        gaps = following.unsqueeze(2) - t.unsqueeze(1)
        return rel, time_gap_bucket(gaps, self.time_buckets)

    def forward(self, indices: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """[B, n, n] from a batch's `indices`."""
        rel, buckets = indices
        return self.position[rel].unsqueeze(0) + self.time[buckets]


class STULayer(nn.Module):
    """One STU layer: x + W_out dropout([u; o; u * LN(o)]), with [u, v, q, k] = LN(x) W_uvqk + b,
    u = SiLU(u) and o the attention of q, k, v."""

    def __init__(
        self,
        dim: int,
        heads: int,
        qk_dim: int,
        v_dim: int,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.heads, self.qk_dim, self.v_dim, self.dropout = heads, qk_dim, v_dim, dropout
        width = heads * (2 * v_dim + 2 * qk_dim)
        self.uvqk = nn.Parameter(nn.init.xavier_uniform_(torch.empty(dim, width)))
        self.uvqk_bias = nn.Parameter(torch.zeros(width))
        self.input_norm = nn.LayerNorm(dim, eps=LN_EPS)
        self.output_norm = nn.LayerNorm(heads * v_dim, eps=LN_EPS)
        self.out = nn.Parameter(nn.init.xavier_uniform_(torch.empty(3 * heads * v_dim, dim)))

    def forward(
        self,
        x: torch.Tensor,
        offsets: torch.Tensor,
        *,
        attn_len: int | None,
        targets: torch.Tensor | None,
        bias: torch.Tensor | None = None,
        weights_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h, dqk, dv = self.heads, self.qk_dim, self.v_dim
        uvqk = torch.addmm(self.uvqk_bias, self.input_norm(x), self.uvqk)
        u, v, q, k = uvqk.split([h * dv, h * dv, h * dqk, h * dqk], dim=1)
        u = F.silu(u)
        with record_function(ATTENTION_SCOPE):
            o = hstu_attention(
                q.reshape(-1, h, dqk),
                k.reshape(-1, h, dqk),
                v.reshape(-1, h, dv),
                offsets,
                alpha=dqk**-0.5,
                attn_len=attn_len,
                targets=targets,
                bias=bias,
                weights_mask=weights_mask,
            ).reshape(-1, h * dv)
        z = torch.cat([u, o, u * self.output_norm(o)], dim=1)
        return x + F.dropout(z, self.dropout, self.training) @ self.out


def position_index(
    lengths: torch.Tensor, n: int, targets: torch.Tensor | None, contextual: int, rows: int
) -> torch.Tensor:
    """[B, n] row of each token in the position table: the prefix's own places 0..K-1, then the
    distance back from the history's end plus K (candidates K, the latest event K + 1, ...)."""
    at = torch.arange(n, device=lengths.device).expand(lengths.numel(), n)
    if targets is None:
        back = lengths.view(-1, 1) - at
    else:
        end = (lengths - targets).view(-1, 1)
        back = end - torch.minimum(at, end)
    back = (back + contextual).clamp(0, rows - 1)  # padding (past the end) is never read
    if contextual > 0:
        back[:, :contextual] = torch.arange(contextual, device=lengths.device)
    return back


def time_index(timestamps: torch.Tensor, offsets: torch.Tensor, rows: int) -> torch.Tensor:
    """[L] row of each token in the time table: floor(sqrt(max(q - t, 1e-6) / 60)), q the
    sequence's last timestamp, at most rows - 1."""
    sequence, _ = jagged_index(offsets)
    last = timestamps[(offsets[1:] - 1).clamp(min=0)]
    gap = (last[sequence] - timestamps).double().clamp(min=1e-6) / 60.0
    return gap.sqrt().floor().long().clamp(0, rows - 1)


class PositionTimeEncoder(nn.Module):
    """DLRMv4's input encoding: x = sqrt(D) m + P[position] + T[time since the last token], then
    dropout. P, T uniform in +-sqrt(1/rows)."""

    def __init__(self, dim: int, position_rows: int, time_rows: int, dropout: float) -> None:
        super().__init__()
        self.dim, self.dropout = dim, dropout
        self.position = nn.Parameter(torch.empty(position_rows, dim))
        self.time = nn.Parameter(torch.empty(time_rows, dim))
        for table in (self.position, self.time):
            bound = math.sqrt(1.0 / table.shape[0])
            nn.init.uniform_(table, -bound, bound)

    def forward(
        self,
        tokens: torch.Tensor,
        timestamps: torch.Tensor,
        offsets: torch.Tensor,
        targets: torch.Tensor | None,
        contextual: int,
    ) -> torch.Tensor:
        lengths = offsets[1:] - offsets[:-1]
        n = int(lengths.max()) if lengths.numel() else 0
        positions = from_padded(
            position_index(lengths, n, targets, contextual, self.position.shape[0]), offsets
        )
        times = time_index(timestamps, offsets, self.time.shape[0])
        x = math.sqrt(self.dim) * tokens + self.position[positions] + self.time[times]
        return F.dropout(x, self.dropout, self.training)
