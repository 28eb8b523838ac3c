"""Evaluation schedule, target tracking and the new job settings (MLPerf-style evaluation,
on-the-fly multi-hot)."""

from __future__ import annotations

import pytest

from shardrec.dataloader.format.manifest import Manifest, SparseFeature
from shardrec.trainer.job.config import load_job_config
from shardrec.trainer.job.data_options import model_manifest, multihot_option
from shardrec.trainer.loop.target import EvalSchedule, TargetTracker


def test_epoch_fraction_evaluates_from_each_epochs_first_step() -> None:
    schedule = EvalSchedule.of(
        0, 0.05, 1001 * 64, 64
    )  # 50 steps: the 1001st step of the epoch is not a boundary
    assert schedule.epoch_steps == 50
    due = [s for s in range(1, 1002) if schedule.due(s, 0)]
    assert due == list(range(50, 1001, 50))
    # The second epoch counts from its own first step.
    assert (
        schedule.next_after(1001, 1001) == 1051
        and schedule.due(1051, 1001)
        and not schedule.due(1050, 1001)
    )
    both = EvalSchedule.of(7, 0.5, 20 * 8, 8)
    assert [s for s in range(1, 21) if both.due(s, 0)] == [7, 10, 14, 20]
    assert EvalSchedule.of(0, 0.0, 20 * 8, 8).next_after(3, 0) is None


def test_epoch_fraction_counts_steps_from_the_training_rows_as_mlperf_does() -> None:
    # MLPerf DLRMv2: every FLOOR(4195197692 / (GLOBAL_BATCH_SIZE * 20)) steps. From the epoch's step
    # count instead (26,220 steps of 160,000, the last partial) it would be 1311 at that RCP batch
    # size.
    rows = 4195197692
    for batch, every in [(32768, 6401), (65536, 3200), (135168, 1551), (160000, 1310)]:
        assert EvalSchedule.of(0, 0.05, rows, batch).epoch_steps == every == rows // (batch * 20)


def test_tracker_records_the_first_evaluation_at_or_over_the_target() -> None:
    tracker = TargetTracker.for_splits(0.7, ["test", "val"], 64)
    assert tracker.split == "val"
    assert tracker.check(5, {"val": {"auc": 0.69}, "test": {"auc": 0.9}}, 1.0) is None
    hit = tracker.check(10, {"val": {"auc": 0.7}}, 2.0)
    assert hit is not None and (
        hit["step"],
        hit["samples_to_target"],
        hit["train_seconds_to_target"],
    ) == (10, 640, 2.0)
    assert tracker.check(15, {"val": {"auc": 0.8}}, 3.0) is None  # only the first counts
    assert (
        tracker.summary()["steps_to_target"] == 10 and tracker.summary()["target_reached"] is True
    )
    off = TargetTracker.for_splits(0.0, ["val"], 64)
    assert (
        off.check(1, {"val": {"auc": 1.0}}, 0.1) is None and off.summary()["target_reached"] is None
    )
    assert (
        TargetTracker.for_splits(0.5, ["val"], 1).check(1, {"val": {"auc": float("nan")}}, 0.0)
        is None
    )


@pytest.mark.parametrize(
    "item, message",
    [
        ("eval.every_epoch_fraction=1.5", r"eval.every_epoch_fraction = 1.5 must lie in \[0, 1\]"),
        ("train.target_auc=-0.1", r"train.target_auc = -0.1 must lie in \[0, 1\]"),
        ("data.multihot_sizes=[3, 0]", r"data.multihot_sizes = \[3, 0\]: 0 must be >= 1"),
        ('data.multihot_dist="zipf"', r"data.multihot_dist = 'zipf' is not one of uniform, pareto"),
        ("data.multihot_seed=-1", r"data.multihot_seed = -1 must lie in \[0, 2\^32\)"),
    ],
)
def test_bad_settings_name_the_key_and_value(item: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_job_config(None, [item])


def test_multihot_rows_need_one_per_size() -> None:
    with pytest.raises(
        ValueError, match=r"data.multihot_rows = \[10\]: 1 values for 2 data.multihot_sizes"
    ):
        load_job_config(None, ["data.multihot_sizes=[3, 1]", "data.multihot_rows=[10]"])


def _manifest() -> Manifest:
    feats = [SparseFeature("a", 50, "uint8"), SparseFeature("b", 7, "uint8")]
    return Manifest(dense_features=["d0"], sparse_features=feats, splits={})


def test_model_manifest_sizes_tables_by_the_index_tables_rows() -> None:
    cfg = load_job_config(
        None, ["data.multihot_sizes=[3, 1]", "data.multihot_rows=[40, 7]", 'data.path="D"']
    )
    seen = model_manifest(_manifest(), cfg.data)
    assert [(f.cardinality, f.multi_hot) for f in seen.sparse_features] == [(40, True), (7, False)]
    option = multihot_option(cfg.data)
    assert (
        option is not None
        and option.sizes == (3, 1)
        and option.rows == (40, 7)
        and option.cache_dir is None
    )
    plain = load_job_config(None, [])
    assert (
        model_manifest(_manifest(), plain.data) is not None and multihot_option(plain.data) is None
    )
    wrong = load_job_config(None, ["data.multihot_sizes=[3]", 'data.path="D"'])
    with pytest.raises(
        ValueError, match=r"data.multihot_sizes has 1 values for 2 sparse features of D"
    ):
        model_manifest(_manifest(), wrong.data)


def test_dlrmv4_evaluates_on_its_grid_from_the_skip_point_its_rules_derive_from_the_batch() -> None:
    """ROUND(0.001 x FLOOR(2290835423 / GBS)) steps apart, the first at or after CEIL(skip x
    samples / GBS): the first evaluations the closed rules require, 57,344,000 samples at a global
    batch of 8192, 71,106,560 at 16384, 94,044,160 at 32768 (the 25th, 31st and 41st evaluation)."""
    samples = 2290835423
    for batch, skip, interval, first in [
        (8192, 0.025, 280, 57_344_000),
        (16384, 0.0303, 140, 71_106_560),
        (32768, 0.041, 70, 94_044_160),
    ]:
        schedule = EvalSchedule.of(0, 0.001, samples, batch, "round", skip)
        assert schedule.epoch_steps == interval
        assert schedule.next_after(0, 0) * batch == first
        assert not schedule.due(first // batch - interval, 0) and schedule.due(first // batch, 0)
