"""bench train's report from the ranks' figures: what its AUC verdict compared."""

from __future__ import annotations

import pytest

from shardrec.tools.bench.train.train_bench import summarise
from shardrec.tools.bench.train.train_report import print_result


def _report(auc: dict[str, float]) -> dict:
    run = {"work": 4096.0, "wall_s": 1.0, "cpu_s": 2.0}
    names = ("stock_fp32", "ours_fp32", "ours_bf16", "ours_fp32_in_memory")
    raw = {
        "runs": {name: [run] for name in names},
        "auc": auc,
        "stock_sharding_types": ["table_wise"],
        "ours_sharding_types": ["table_wise"],
    }
    return summarise(raw, "demo", 2, 1, 32, 1)


@pytest.mark.parametrize(
    ("bf16", "verdict"),
    [
        (
            0.5695,
            "does NOT count: its val AUC 0.5695 differs from ours fp32's 0.5675 by more than 0.002",
        ),
        (0.5685, "counts: its val AUC 0.5685 is within 0.002 of ours fp32's 0.5675"),
    ],
)
def test_the_bf16_verdict_names_the_two_aucs_it_compared(capsys, bf16: float, verdict: str):
    # Stock's AUC is printed beside it but is not what bf16's is held against.
    report = _report({"stock_fp32": 0.5685, "ours_fp32": 0.5675, "ours_bf16": bf16})
    print_result(report)
    out = " ".join(capsys.readouterr().out.split())
    bf16_line = next(line for line in out.split("ours bf16 / stock torchrec fp32:")[1:])
    assert f"(target >= 1.5); {verdict}" in bf16_line
