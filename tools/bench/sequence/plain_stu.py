"""The baseline of `shardrec bench train --model hstu`: the STU layer written as a plain PyTorch
program, the way the reference's PyTorch path computes it.

The reference's own PyTorch attention (meta-recsys/generative-recommenders,
`ops/pytorch/pt_hstu_attention.py`) runs on CPU here, but it is another project's code that
shardrec neither ships nor installs; so the baseline is an independent plain version of the same layer
(and `bench train --model hstu --reference DIR` runs it a second time with the reference's own
`pytorch_hstu_mha` as its attention, imported from the checkout DIR the user gives):
`nn.Linear` and `nn.LayerNorm` modules, every sequence padded to the attention's full length N
(as the reference pads to max_seq_len), the mask built from index comparisons on every call, the
scores through einsum. It computes the function shardrec's layer (trainer/model/hstu.py)
computes, which pads to the batch's longest sequence, makes the mask once per batch for all
layers and folds the divisor into it; the bench checks both give the same logits before it
times them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

REFERENCE_MODULE = "generative_recommenders.ops.pytorch.pt_hstu_attention"


def reference_attention(checkout: Path) -> Callable:
    """The reference's own PyTorch attention, `pytorch_hstu_mha`, imported from a checkout of
    meta-recsys/generative-recommenders (its repository root) that the user gives; ValueError in one
    line where it is not there or does not import. Nothing of it is copied into shardrec."""
    import importlib

    if not (checkout / "generative_recommenders" / "ops" / "pytorch").is_dir():
        raise ValueError(
            f"--reference {checkout}: no generative_recommenders/ops/pytorch there (give the root "
            "of a meta-recsys/generative-recommenders checkout)"
        )
    sys.path.insert(0, str(checkout))
    try:
        module = importlib.import_module(REFERENCE_MODULE)
    except Exception as e:  # its imports are not ours to know: say which and why
        raise ValueError(f"--reference {checkout}: {REFERENCE_MODULE} does not import ({e})") from e
    import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm, which the reference calls)

    return module.pytorch_hstu_mha


class PlainSTULayer(nn.Module):
    """One STU layer, plainly: x + W_out dropout([u; o; u * LN(o)])."""

    def __init__(
        self,
        dim: int,
        heads: int,
        qk_dim: int,
        v_dim: int,
        length: int,
        dropout: float,
        mha: Callable | None = None,
    ):
        super().__init__()
        self.mha = mha  # the attention when not the plain one below: the reference's
        self.heads, self.qk_dim, self.v_dim, self.length = heads, qk_dim, v_dim, length
        self.dropout = dropout
        self.input_norm = nn.LayerNorm(dim, eps=1e-6)
        self.uvqk = nn.Linear(dim, heads * (2 * v_dim + 2 * qk_dim))
        self.output_norm = nn.LayerNorm(heads * v_dim, eps=1e-6)
        self.out = nn.Linear(3 * heads * v_dim, dim, bias=False)

    @classmethod
    def like(cls, layer: nn.Module, length: int, mha: Callable | None = None) -> PlainSTULayer:
        """A plain layer with the weights of shardrec's STULayer `layer` (and the attention `mha`,
        when given)."""
        dim = layer.uvqk.shape[0]
        plain = cls(dim, layer.heads, layer.qk_dim, layer.v_dim, length, layer.dropout, mha)
        with torch.no_grad():
            plain.uvqk.weight.copy_(layer.uvqk.t())
            plain.uvqk.bias.copy_(layer.uvqk_bias)
            plain.out.weight.copy_(layer.out.t())
            plain.input_norm.load_state_dict(layer.input_norm.state_dict())
            plain.output_norm.load_state_dict(layer.output_norm.state_dict())
        return plain.to(layer.uvqk.device)

    def forward(self, x, offsets, *, attn_len, targets, bias=None, weights_mask=None):
        if bias is not None:
            raise ValueError('the plain layer has no pairwise bias (hstu_bias = "input" only)')
        h, dqk, dv, n = self.heads, self.qk_dim, self.v_dim, self.length
        u, v, q, k = self.uvqk(self.input_norm(x)).split([h * dv, h * dv, h * dqk, h * dqk], 1)
        u = F.silu(u)
        if self.mha is not None:
            o = self.mha(
                max_seq_len=n,
                alpha=dqk**-0.5,
                q=q.reshape(-1, h, dqk),
                k=k.reshape(-1, h, dqk),
                v=v.reshape(-1, h, dv),
                seq_offsets=offsets.long(),
                causal=True,
                dropout_pr=0.0,
                training=self.training,
                num_targets=targets.long(),
            ).reshape(-1, h * dv)
            z = torch.cat([u, o, u * self.output_norm(o)], dim=1)
            return x + self.out(F.dropout(z, self.dropout, self.training))
        lengths = offsets[1:] - offsets[:-1]
        batch = lengths.numel()
        row = torch.repeat_interleave(torch.arange(batch, device=x.device), lengths)
        pos = torch.arange(x.shape[0], device=x.device) - offsets[row]

        def pad(t, width):
            out = t.new_zeros(batch, n, h, width)
            out[row, pos] = t.reshape(-1, h, width)
            return out

        qp, kp, vp = pad(q, dqk), pad(k, dqk), pad(v, dv)
        scores = torch.einsum("bihd,bjhd->bhij", qp, kp) * dqk**-0.5
        index = torch.arange(n, device=x.device).expand(batch, n)
        end = (lengths - targets).view(-1, 1)
        causal = torch.minimum(index, end)
        valid = (causal.unsqueeze(2) > causal.unsqueeze(1)) | torch.eye(
            n, dtype=torch.bool, device=x.device
        )
        weights = F.silu(scores) / n * valid.unsqueeze(1)
        o = torch.einsum("bhij,bjhd->bihd", weights, vp)[row, pos].reshape(-1, h * dv)
        z = torch.cat([u, o, u * self.output_norm(o)], dim=1)
        return x + self.out(F.dropout(z, self.dropout, self.training))
