"""`bench train --reference DIR`: the wrapper runs a checkout's dlrm_main.main as it is, reads the
clock around its training steps only (not its evaluation's), keeps the AUROC its `_evaluate`
returns, and refuses a folder that is not a checkout. A stand-in dlrm_main (same names, same
calls) takes the reference's place: the suite cannot fetch the real one."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from shardrec.tools.bench.train import reference_dlrm

STAND_IN = """
import time


class TrainPipelineSparseDist:
    def __init__(self, model):
        self._model = model

    def progress(self, it):
        time.sleep(0.01 if self._model.training else 0.05)
        return next(it)


class Model:
    training = True


def _evaluate(limit, pipeline, loader, stage):
    pipeline._model.training = False
    pipeline.progress(iter([0]))
    return {"val": 0.75, "test": 0.7}[stage]


def main(argv):
    steps = int(argv[argv.index("--limit_train_batches") + 1])
    pipeline = TrainPipelineSparseDist(Model())
    batches = iter(range(steps))
    for _ in range(steps):
        pipeline.progress(batches)
    _evaluate(None, pipeline, None, "val")
    _evaluate(None, pipeline, None, "test")
"""


def test_the_wrapper_times_training_steps_and_keeps_the_references_auc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout = tmp_path / "dlrm"
    (checkout / "torchrec_dlrm").mkdir(parents=True)
    (checkout / "torchrec_dlrm" / "dlrm_main.py").write_text(STAND_IN)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "dlrm_main", raising=False)
    monkeypatch.setenv("RANK", "0")
    args = reference_dlrm.reference_args(
        tmp_path / "days", per_rank_batch=32, table_rows=100, embedding_dim=8, dense_arch=[8],
        over_arch=[4, 1], learning_rate=0.005, train_steps=7, val_batches=1,
    )  # fmt: skip
    assert args[args.index("--over_arch_layer_sizes") + 1] == "4,1" and "--adagrad" in args
    reference_dlrm.rank_main(str(checkout), str(tmp_path), "2,4,0", args)
    got = reference_dlrm.read_reference_round(tmp_path, warmup=2, steps=4, global_batch=64)
    samples, wall, cpu = got["run"]
    assert samples == 4 * 64 and got["auc"] == 0.75 and got["breakdown"] is None
    # 4 training steps of 10 ms: the evaluation's slower steps are not counted.
    assert 0.04 <= wall < 0.2 and 0 <= cpu < wall
    with pytest.raises(RuntimeError, match="trained 7 steps, fewer than the 11 timed"):
        reference_dlrm.read_reference_round(tmp_path, warmup=2, steps=8, global_batch=64)
    monkeypatch.delitem(sys.modules, "dlrm_main", raising=False)


def test_figures_written_at_the_val_auc_survive_a_failed_test_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real reference's ranks now and then abort in the test pass after the measured steps:
    the figures are on disk from its val AUC on, and the round reads whole."""
    checkout = tmp_path / "dlrm"
    (checkout / "torchrec_dlrm").mkdir(parents=True)
    failing = STAND_IN.replace(
        '    return {"val": 0.75, "test": 0.7}[stage]',
        '    if stage == "test":\n        raise SystemExit(134)\n    return 0.75',
    )
    assert failing != STAND_IN
    (checkout / "torchrec_dlrm" / "dlrm_main.py").write_text(failing)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "dlrm_main", raising=False)
    monkeypatch.setenv("RANK", "1")
    args = ["--limit_train_batches", "7"]
    with pytest.raises(SystemExit):
        reference_dlrm.rank_main(str(checkout), str(tmp_path), "2,4,0", args)
    assert [p.name for p in tmp_path.glob("rank-*.json")] == ["rank-1.json"]
    got = reference_dlrm.read_reference_round(tmp_path, warmup=2, steps=4, global_batch=64)
    assert got["run"][0] == 4 * 64 and got["auc"] == 0.75
    # A rank that failed before its val AUC leaves no round to keep.
    figures = json.loads((tmp_path / "rank-1.json").read_text())
    figures["auc"] = {}
    (tmp_path / "rank-1.json").write_text(json.dumps(figures))
    with pytest.raises(RuntimeError, match="the reference wrote no val AUC into"):
        reference_dlrm.read_reference_round(tmp_path, warmup=2, steps=4, global_batch=64)
    monkeypatch.delitem(sys.modules, "dlrm_main", raising=False)


def test_a_folder_that_is_not_a_checkout_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as refused:
        reference_dlrm.check_reference(tmp_path)
    assert str(refused.value) == (
        f"--reference {tmp_path}: no torchrec_dlrm/dlrm_main.py there; point it at a checkout "
        "of https://github.com/facebookresearch/dlrm"
    )
