"""The baselines of `shardrec bench train --model hstu` (tools/bench/sequence/plain_stu.py): the
plain layer computes shardrec's STU layer, and with an attention function of the reference's
signature in it (what --reference DIR supplies) it still does; a DIR that is no checkout of the
reference is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shardrec.tools.bench.sequence.plain_stu import PlainSTULayer, reference_attention
from shardrec.trainer.model.hstu import STULayer, hstu_attention


def _with_reference_signature(calls: list[dict]):
    """shardrec's attention behind pytorch_hstu_mha's keyword signature, recording each call."""

    def mha(*, max_seq_len, alpha, q, k, v, seq_offsets, causal, dropout_pr, training, num_targets):
        calls.append({"max_seq_len": max_seq_len, "alpha": alpha, "q": tuple(q.shape)})
        assert causal and dropout_pr == 0.0
        out = hstu_attention(
            q, k, v, seq_offsets, alpha=alpha, attn_len=max_seq_len, targets=num_targets
        )
        return out

    return mha


def test_the_plain_layer_and_the_one_with_the_references_attention_compute_shardrecs_layer():
    torch.manual_seed(0)
    ours = STULayer(16, 2, 4, 6).eval()
    offsets = torch.tensor([0, 3, 9, 14])
    targets = torch.ones(3, dtype=torch.long)
    x = torch.randn(14, 16)
    want = ours(x, offsets, attn_len=12, targets=targets)
    plain = PlainSTULayer.like(ours, 12).eval()
    assert torch.allclose(plain(x, offsets, attn_len=12, targets=targets), want, atol=1e-6)
    calls: list[dict] = []
    swapped = PlainSTULayer.like(ours, 12, _with_reference_signature(calls)).eval()
    assert torch.allclose(swapped(x, offsets, attn_len=12, targets=targets), want, atol=1e-6)
    # The reference pads to max_seq_len and scales q.k by qk_dim ** -0.5.
    assert calls == [{"max_seq_len": 12, "alpha": 0.5, "q": (14, 2, 4)}]


def test_a_reference_directory_that_is_no_checkout_is_refused_in_one_line(tmp_path: Path):
    with pytest.raises(ValueError) as e:
        reference_attention(tmp_path)
    assert str(e.value) == (
        f"--reference {tmp_path}: no generative_recommenders/ops/pytorch there (give the root of a "
        "meta-recsys/generative-recommenders checkout)"
    )
    package = tmp_path / "generative_recommenders" / "ops" / "pytorch"
    package.mkdir(parents=True)
    with pytest.raises(ValueError, match=r"pt_hstu_attention does not import \(No module named"):
        reference_attention(tmp_path)
