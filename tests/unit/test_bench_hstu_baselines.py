"""The baselines of `shardrec bench train --model hstu` (tools/bench/sequence/plain_stu.py): the
plain layer computes shardrec's STU layer, and with an attention function of the reference's
signature in it (what --reference DIR supplies) it still does; a DIR that is no checkout of the
reference is refused in one line."""

from __future__ import annotations

import json
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


def _fake_ranks(monkeypatch: pytest.MonkeyPatch, steps: int, wall_s: float) -> None:
    """The HSTU bench's ranks replaced by a result file as bench_rank writes it: every variant's
    runs `wall_s` long (ours twice the plain layer's rate), so that no torchrun starts."""

    from shardrec.tools.bench.sequence import hstu_bench
    from shardrec.tools.bench.train import train_bench

    samples = steps * 256.0
    runs = {
        "ours": [{"work": samples, "wall_s": wall_s, "cpu_s": wall_s}] * 2,
        "plain_layer": [{"work": samples / 2, "wall_s": wall_s, "cpu_s": wall_s}] * 2,
        "ours_from_disk": [{"work": samples, "wall_s": wall_s, "cpu_s": wall_s}] * 2,
    }
    raw = {
        "runs": runs,
        # The rates alone, as the ranks reported them before runs (CPU seconds) were kept.
        "rates": {k: [r["work"] / r["wall_s"] for r in v] for k, v in runs.items()},
        "max_logit_difference": {"plain_layer": 0.0},
        "profiled_seconds": wall_s,
        "shares": {"attention": 0.5, "lookups": 0.2, "all_to_all": 0.1},
        "sharding_types": ["table_wise"],
        "sequence_dedup": True,
    }
    monkeypatch.setattr(hstu_bench, "write_events", lambda directory, rows: directory)
    monkeypatch.setattr(
        train_bench,
        "launch_ranks",
        lambda module, args, nproc, threads: Path(args[1]).write_text(json.dumps(raw)),
    )


def _hstu_bench(steps: int, *more: str):
    """`shardrec bench train --model hstu` over fake ranks of `steps` steps a window (_fake_ranks)."""
    from typer.testing import CliRunner

    from shardrec.tools.cli.app import app

    args = ["bench", "train", "--model", "hstu", "--rows", "3000", "--steps", str(steps)]
    return CliRunner().invoke(app, [*args, "--rounds", "2", *more])


def test_a_window_of_too_few_hstu_steps_says_too_small_instead_of_a_ratio(
    monkeypatch: pytest.MonkeyPatch,
):
    _fake_ranks(monkeypatch, steps=3, wall_s=1.0)
    result = _hstu_bench(3)
    assert result.exit_code == 0, result.output
    assert (
        "ours / the plain PyTorch layer (same weights, plan, batches): too small to measure "
        "(3 steps a window, under 16); logits differ by at most 0.00e+00"
    ) in result.stdout
    report = json.loads(_hstu_bench(3, "--json").stdout)
    assert report["ours_vs_plain_layer"] == {"too_small": "3 steps a window, under 16", "rounds": 2}


def test_an_hstu_ratio_has_its_spread_and_its_figure_per_cpu_second(
    monkeypatch: pytest.MonkeyPatch,
):
    _fake_ranks(monkeypatch, steps=32, wall_s=1.0)
    result = _hstu_bench(32)
    assert result.exit_code == 0, result.output
    assert (
        "ours / the plain PyTorch layer (same weights, plan, batches): 2.00x (2.00-2.00 over 2 "
        "rounds, spread 0%); per CPU-s 2.00x (2.00-2.00)"
    ) in result.stdout
