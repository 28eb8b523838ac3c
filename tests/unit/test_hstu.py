"""shardrec's HSTU layers (trainer/model/hstu.py) against the reference and against the equations.

The reference's PyTorch attention cannot run in this suite (it is another project's code, not a
dependency): tests/fixtures/hstu_reference.json holds inputs and the outputs and gradients the
reference computed for them (tests/fixtures/hstu_reference_values.py, run outside the repository,
wrote it). Beside that, the attention mask is checked against one built element by element from
the equations, and the attention's gradients in float64 by finite differences.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from shardrec.trainer.model.hstu import (
    PositionTimeEncoder,
    RelativeBias,
    STULayer,
    attention_mask,
    hstu_attention,
)

GOLDEN = json.loads((Path(__file__).parents[1] / "fixtures" / "hstu_reference.json").read_text())


def _t(values, *shape, dtype=torch.float32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype).reshape(*shape)


def _offsets(lengths) -> torch.Tensor:
    return torch.cat([torch.zeros(1, dtype=torch.long), torch.tensor(lengths).cumsum(0)])


@pytest.mark.parametrize("index", range(len(GOLDEN["attention"])))
def test_attention_equals_the_reference_values(index):
    case = GOLDEN["attention"][index]
    total, h = sum(case["lengths"]), case["heads"]
    q = _t(case["q"], total, h, case["qk_dim"]).requires_grad_()
    k = _t(case["k"], total, h, case["qk_dim"]).requires_grad_()
    v = _t(case["v"], total, h, case["v_dim"]).requires_grad_()
    out = hstu_attention(
        q,
        k,
        v,
        _offsets(case["lengths"]),
        alpha=case["qk_dim"] ** -0.5,
        attn_len=case["attn_len"],
        targets=torch.tensor(case["targets"]) if case["targets"] else None,
        contextual=case["contextual"],
        max_attn_len=case["max_attn_len"],
    )
    expect = _t(case["out"], *out.shape)
    assert (out - expect).abs().max() <= 1e-6
    grads = torch.autograd.grad((out * _t(case["cotangent"], *out.shape)).sum(), (q, k, v))
    for name, got in zip(("grad_q", "grad_k", "grad_v"), grads):
        assert (got - _t(case[name], *got.shape)).abs().max() <= 1e-5, name


def test_stu_layer_equals_the_reference_values():
    case = GOLDEN["stu"]
    layer = STULayer(case["dim"], case["heads"], case["qk_dim"], case["v_dim"])
    params = dict(layer.named_parameters())
    with torch.no_grad():
        for name, values in case["params"].items():
            params[name].copy_(_t(values, *params[name].shape))
    x = _t(case["x"], sum(case["lengths"]), case["dim"]).requires_grad_()
    out = layer(
        x,
        _offsets(case["lengths"]),
        attn_len=case["attn_len"],
        targets=torch.tensor(case["targets"]),
    )
    assert (out - _t(case["out"], *out.shape)).abs().max() <= 1e-6
    grads = torch.autograd.grad(
        (out * _t(case["cotangent"], *out.shape)).sum(), [x, *(params[n] for n in case["params"])]
    )
    assert (grads[0] - _t(case["grad_x"], *x.shape)).abs().max() <= 1e-5
    for name, got in zip(case["params"], grads[1:]):
        assert (got - _t(case["grad_params"][name], *got.shape)).abs().max() <= 1e-5, name


def test_position_and_time_encoding_equals_the_reference_values():
    """With a time table as wide as it is long: the reference's PyTorch path clamps time buckets at
    its table's width - 1 (a slip: its Triton kernel, the benchmark's, clamps at rows - 1, as we do),
    so only then are both the same function."""
    case = GOLDEN["encoding"]
    dim, total = case["dim"], sum(case["lengths"])
    encoder = PositionTimeEncoder(dim, len(case["position"]) // dim, dim, dropout=0.0)
    with torch.no_grad():
        encoder.position.copy_(_t(case["position"], -1, dim))
        encoder.time.copy_(_t(case["time"], -1, dim))
    out = encoder(
        _t(case["tokens"], total, dim),
        torch.tensor(case["timestamps"]),
        _offsets(case["lengths"]),
        torch.tensor(case["targets"]),
        case["contextual"],
    )
    assert (out - _t(case["out"], total, dim)).abs().max() <= 1e-5


def _mask_by_hand(length: int, n: int, targets: int, contextual: int, max_attn_len: int):
    """valid(i, j) for one sequence, element by element: causal over an index that gives the
    candidates the first candidate's place, a window of max_attn_len, and a prefix that sees the
    whole history."""
    end = length - targets - (contextual - 1 if contextual else 0)

    def index(i: int) -> int:
        c = max(i - contextual + 1, 0) if contextual else i
        return min(c, end) if targets else c

    valid = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(n):
            ok = i == j or index(i) > index(j)
            if max_attn_len:
                ok = ok and index(i) - index(j) <= max_attn_len
            if contextual and index(i) == 0 and index(j) < end:
                ok = True
            valid[i, j] = ok
    return valid


@pytest.mark.parametrize(
    "targets, contextual, max_attn_len", [(0, 0, 0), (1, 0, 0), (3, 0, 0), (1, 3, 0), (2, 0, 2)]
)
def test_attention_mask_follows_the_equations(targets, contextual, max_attn_len):
    lengths, n = [9, 5, 7], 9
    got = attention_mask(
        torch.tensor(lengths),
        n,
        torch.tensor([targets] * 3) if targets else None,
        contextual,
        max_attn_len,
    )
    for b, length in enumerate(lengths):
        expect = _mask_by_hand(length, n, targets, contextual, max_attn_len)
        assert torch.equal(got[b, :length, :length], expect[:length, :length]), (b, length)


def test_attention_gradients_in_float64_match_finite_differences():
    g = torch.Generator().manual_seed(3)
    offsets = _offsets([2, 1, 3])
    q, k, v = (torch.randn(6, 1, 2, generator=g, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(3, 3, 3, generator=g, dtype=torch.float64)
    for t in (q, k, v, bias):
        t.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda q, k, v, bias: hstu_attention(
            q, k, v, offsets, alpha=0.5, attn_len=4, targets=torch.tensor([1, 1, 1]), bias=bias
        ),
        (q, k, v, bias),
    )


def test_a_sequence_scores_alike_alone_or_beside_longer_ones():
    """With a fixed attention length, a sample's output does not depend on its batch (what eval,
    export and predict need); the reference's batch maximum would make it depend."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(9, 2, 4, generator=g) for _ in range(3))
    together = hstu_attention(q, k, v, _offsets([3, 6]), alpha=0.5, attn_len=16)
    alone = hstu_attention(q[:3], k[:3], v[:3], _offsets([3]), alpha=0.5, attn_len=16)
    assert torch.equal(together[:3], alone)
    by_batch = hstu_attention(q, k, v, _offsets([3, 6]), alpha=0.5, attn_len=None)
    alone_by_batch = hstu_attention(q[:3], k[:3], v[:3], _offsets([3]), alpha=0.5, attn_len=None)
    assert not torch.allclose(by_batch[:3], alone_by_batch)


def test_a_recency_slope_starts_each_earlier_token_lower_by_its_distance():
    """RelativeBias(recency=s) starts as the plain one (same draws) minus s x (i - j) for every key j
    at or before query i; later keys (masked by causality) are untouched."""
    stamps, offsets = torch.tensor([0, 7, 60, 61, 900]), _offsets([2, 3])
    torch.manual_seed(3)
    plain = RelativeBias(4, time_buckets=16)
    plain = plain(plain.indices(stamps, offsets))
    torch.manual_seed(3)
    prior = RelativeBias(4, time_buckets=16, recency=0.5)
    prior = prior(prior.indices(stamps, offsets))
    i, j = torch.meshgrid(torch.arange(3), torch.arange(3), indexing="ij")
    expected = torch.where(j <= i, -0.5 * (i - j), 0.0).float()
    assert torch.allclose(prior - plain, expected.expand(2, 3, 3))


def test_a_sequence_gets_the_same_relative_bias_alone_or_beside_a_longer_one():
    """The last token's time gap is to its own time, not to the padding after it: a sample's bias
    (and so its score) does not depend on the batch, nor on the world size eval runs at."""
    torch.manual_seed(0)
    bias = RelativeBias(8, time_buckets=32, recency=0.3)
    stamps = torch.tensor([100, 160, 400, 0, 50, 90, 2000, 2600, 9000])
    together = bias(bias.indices(stamps, _offsets([3, 6])))  # [2, 6, 6]
    alone = bias(bias.indices(stamps[:3], _offsets([3])))  # [1, 3, 3]
    assert torch.equal(together[0, :3, :3], alone[0])
